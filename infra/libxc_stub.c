/* A stand-in for gpu4pyscf's CUDA libxc (infra/gpu_host.sh pack --stub-libxc): the symbols
 * gpu4pyscf.dft.libxc reads when it is imported, reporting no functionals. Hartree-Fock and
 * DF-MP2 never call libxc; a DFT functional fails to initialise (xc_func_init returns -1). */
#include <stddef.h>

const char *xc_version_string(void) { return "stub (no functionals)"; }
int xc_number_of_functionals(void) { return 0; }
void xc_available_functional_numbers(int *ids) { (void)ids; }
const char *xc_functional_get_name(int id) { (void)id; return ""; }
void *xc_func_alloc(void) { return NULL; }
int xc_func_init(void *func, int id, int spin) { (void)func; (void)id; (void)spin; return -1; }
void xc_func_end(void *func) { (void)func; }
void xc_func_free(void *func) { (void)func; }
int xc_func_info_get_n_ext_params(const void *info) { (void)info; return 0; }
const char *xc_func_info_get_ext_params_name(const void *info, int i) { (void)info; (void)i; return NULL; }
void xc_func_set_ext_params_name(void *func, const char *name, double value) { (void)func; (void)name; (void)value; }
