"""No step of mp2 or run takes a long argument list (docs/architecture.md, Rules): what a run shares
travels as one object (the pipeline's per-run state, `mp2.run_state.CorrelationRun`; the settings; the
run context), so a function takes at most `MOST_PARAMETERS`, unless `LONG_SIGNATURES` says why."""

import ast

from test_architecture import MODULES

PARAMETER_LAYERS = ("mp2", "run")
MOST_PARAMETERS = 7  # self and cls aside; *args and **kwargs count one each
# (module, qualified name) -> why it takes more
LONG_SIGNATURES = {
    ("mp2.pipeline", "dfmp2_energy"): "public: the user's signature (a reference's orbitals, Settings and their "
                                      "keyword changes, fock_mo, context, given B)",
    ("mp2.pipeline", "correlation_energy"): "the driver's entry: the run's inputs, from which it builds the "
                                            "per-run state (CorrelationRun) once",
    ("mp2.b.provider", "ovL_of_orbitals"): "public: steps 1-3 alone, dfmp2_energy's arguments and `out`",
    ("mp2.gradient", "nuclear_gradient"): "the gradient's callers' (the drop-ins, the tests) keywords: the "
                                          "solver's tol and max_cycle, the sizes and arrays of the fitting",
    ("mp2.gradient", "_reference_terms"): "the gradient's reference terms of nuclear_gradient's own keywords "
                                          "(arrays, aux_block, max_memory)",
    ("mp2.gradient", "reference_fitting_densities"): "called by the tests with their own fitting set and "
                                                     "keyword sizes (aux_block, max_memory)",
    ("mp2.response", "relaxed_density"): "the drop-ins' and the gradient's: the Z-vector solver's keywords "
                                         "(tol, max_cycle, derivatives, with_potentials)",
    ("mp2.b.ranks", "rows_from_columns"): "one collective (the all-to-all of step 3): the team's layout and the "
                                          "wire's dtype and device, no per-run state",
    ("mp2.b.ranks", "pass_blocks"): "one collective (a ring step of step 4): the blocks and the wire's dtype "
                                    "and device, no per-run state",
    ("run.memory", "plan_for"): "the memory plan's options by keyword (on_disk, ranks, growth, gamma, held, "
                                "stages), each a caller's",
    ("run.memory", "plan_memory"): "the budget's sizes by keyword only (baseline, device_limit, ranks, growth, ...)",
}


def parameter_count(function) -> int:
    """The parameters of a def: positional, keyword-only, *args and **kwargs (one each); self and cls aside."""
    arguments = function.args
    named = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return len([n for n in named if n not in ("self", "cls")]) + bool(arguments.vararg) + bool(arguments.kwarg)


def long_signatures(name: str, source: str, allowed: dict = LONG_SIGNATURES) -> list:
    """The functions of a module (qualified: Class.method, outer.inner) taking more than MOST_PARAMETERS
    that `allowed` does not list, and the entries of `allowed` for this module that take no more (a stale
    reason)."""
    found, listed = [], set()

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualified = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    count = parameter_count(child)
                    if count > MOST_PARAMETERS and (name, qualified) in allowed:
                        listed.add(qualified)
                    elif count > MOST_PARAMETERS:
                        found.append(f"{name}:{child.lineno} {qualified} takes {count} parameters "
                                     f"(> {MOST_PARAMETERS}, not listed)")
                visit(child, qualified + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    stale = [f"{name} {qualified} is listed but takes no more than {MOST_PARAMETERS}"
             for module, qualified in allowed if module == name and qualified not in listed]
    return found + stale


def test_no_step_takes_a_long_argument_list():
    """docs/architecture.md: the per-run state travels as one object (`CorrelationRun`); the allow-list
    names every longer signature, each with its reason, and names only those."""
    findings = [f for name, path in MODULES.items() if name.startswith(PARAMETER_LAYERS)
                for f in long_signatures(name, path.read_text())]
    listed = {module for module, _ in LONG_SIGNATURES}
    assert listed <= set(MODULES), sorted(listed - set(MODULES))
    assert not findings, findings
    assert all(reason for reason in LONG_SIGNATURES.values())


def test_the_rule_catches_a_long_argument_list():
    """The check itself: the density stage as it was before the per-run state, a method, a nested function, a
    listed function and a stale entry."""
    old = ("def density_stage(backend, provider, channels, selected, plan, settings, metric_factor, team=None):\n"
           "    pass\n")
    assert long_signatures("mp2.pipeline", old, {}) == [
        "mp2.pipeline:1 density_stage takes 8 parameters (> 7, not listed)"]
    assert long_signatures("mp2.pipeline", "def density_stage(run, provider):\n    pass\n", {}) == []
    method = "class B:\n    def __init__(self, a, b, c, d, e, f, g):\n        def inner(a, b, *c, d, e, f, h, **g):\n" \
             "            pass\n"
    assert long_signatures("m", method, {}) == ["m:3 B.__init__.inner takes 8 parameters (> 7, not listed)"]
    assert long_signatures("m", "def f(a, b, c, d, e, f, g, *, h):\n    pass\n", {("m", "f"): "why"}) == []
    assert long_signatures("m", "def f(a):\n    pass\n", {("m", "f"): "why"}) == [
        "m f is listed but takes no more than 7"]
