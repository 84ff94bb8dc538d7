#!/usr/bin/env bash
# Set up a bare NVIDIA GPU host that has Python, CUDA and a CUDA torch but no package index (an
# air-gapped node, or a lent benchmark machine that takes a limited upload per command): pack the
# Python packages dfmp2's GPU runs need here, carry the parts over, install them there.
#
#   infra/gpu_host.sh pack DIR [--python 3.12] [--part-mb 60] [--gpu4pyscf] [--stub-libxc]
#       (here, with pip and an index) downloads the wheels for the host's Python (PySCF; with
#       --gpu4pyscf also gpu4pyscf-cuda13x, its libxc and geomeTRIC), unpacks them into one
#       xz-compressed tar stream (PySCF first) and splits it into DIR/part-NN of at most PART-MB MB,
#       with DIR/MANIFEST (part count, sizes, sha256 of the stream). --stub-libxc replaces
#       gpu4pyscf's 118 MB CUDA libxc by a stub of the symbols gpu4pyscf reads at import (about two
#       fewer 60 MB parts): Hartree-Fock and DF-MP2 then run, any DFT functional fails to initialise.
#   infra/gpu_host.sh install DIR [TARGET]
#       (on the host, from the repository root) copies DIR's parts into $TARGET.parts, which keeps
#       them across calls, joins every part present in order and unpacks what they hold into
#       TARGET (default /tmp/site). With all parts the stream's sha256 must match MANIFEST; with the
#       first parts only it unpacks the packages those parts hold whole (PySCF comes first) and says
#       how many parts are still missing. Then: export PYTHONPATH=TARGET:$PWD
#
# The host's own numpy, scipy, h5py, click, threadpoolctl, cupy and torch are used (a CUDA image
# has them); dfmp2 itself runs from the checkout (python -m dfmp2 with PYTHONPATH).
set -euo pipefail

pack() {
    local dir=$1; shift
    local python=3.12 part_mb=60 gpu4pyscf=0 stub=0
    while [ $# -gt 0 ]; do
        case $1 in
            --python) python=$2; shift 2 ;;
            --part-mb) part_mb=$2; shift 2 ;;
            --gpu4pyscf) gpu4pyscf=1; shift ;;
            --stub-libxc) stub=1; shift ;;
            *) echo "gpu_host.sh pack: unknown option $1" >&2; exit 2 ;;
        esac
    done
    local stage wheels
    stage=$(mktemp -d); wheels=$stage/wheels; mkdir -p "$wheels" "$stage/site" "$dir"
    local platforms=()
    for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
        platforms+=(--platform "$tag")
    done
    local wanted=(pyscf==2.14.0)
    [ $gpu4pyscf = 1 ] && wanted+=(gpu4pyscf-cuda13x==1.9.0)
    [ $gpu4pyscf = 1 ] && [ $stub = 0 ] && wanted+=(gpu4pyscf-libxc-cuda13x==0.9.0)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
        "${platforms[@]}" -d "$wheels" "${wanted[@]}"
    [ $gpu4pyscf = 1 ] && python3 -m pip download -q --no-deps -d "$wheels" geometric==1.1.1
    local order=(pyscf)  # PySCF first: the first parts alone give a host that runs dfmp2
    for wheel in "$wheels"/*.whl; do unzip -q -o "$wheel" -d "$stage/site"; done
    if [ $gpu4pyscf = 1 ]; then
        tar -xzf "$wheels"/geometric-*.tar.gz -C "$stage" && cp -r "$stage"/geometric-*/geometric "$stage/site/"
        if [ $stub = 1 ]; then
            mkdir -p "$stage/site/gpu4pyscf/lib/deps/lib"
            gcc -shared -fPIC -O2 -o "$stage/site/gpu4pyscf/lib/deps/lib/libxc.so" "$(dirname "$0")/libxc_stub.c"
        fi
        order+=(geometric gpu4pyscf)
    fi
    local members=()
    for name in "${order[@]}"; do
        members+=("$name")
        for extra in "$stage/site/$name"-*.dist-info "$stage/site/$name"_*; do
            [ -e "$extra" ] && members+=("$(basename "$extra")")
        done
    done
    (cd "$stage/site" && tar -cf - "${members[@]}") | xz -9 > "$stage/stream.tar.xz"
    rm -f "$dir"/part-* "$dir/MANIFEST"
    split -b "${part_mb}M" -d -a 2 "$stage/stream.tar.xz" "$dir/part-"
    {
        echo "parts $(ls "$dir"/part-* | wc -l)"
        echo "sha256 $(sha256sum "$stage/stream.tar.xz" | cut -d' ' -f1)"
        echo "packages ${order[*]} (python $python)$([ $stub = 1 ] && echo ', libxc stubbed')"
        (cd "$dir" && ls -l part-* | awk '{print $NF, $5}')
    } > "$dir/MANIFEST"
    rm -rf "$stage"
    cat "$dir/MANIFEST"
}

install() {
    local dir=$1 target=${2:-/tmp/site}
    local keep=$target.parts
    mkdir -p "$target" "$keep"
    cp "$dir/MANIFEST" "$keep/" 2>/dev/null || true
    for part in "$dir"/part-*; do [ -e "$part" ] && cp "$part" "$keep/"; done
    local want have
    want=$(awk '/^parts/{print $2}' "$keep/MANIFEST")
    have=$(ls "$keep"/part-* 2>/dev/null | wc -l)
    if [ "$have" = "$want" ]; then
        local sum
        sum=$(cat "$keep"/part-* | sha256sum | cut -d' ' -f1)
        if [ "$sum" != "$(awk '/^sha256/{print $2}' "$keep/MANIFEST")" ]; then
            echo "gpu_host.sh install: the joined parts do not match MANIFEST's sha256" >&2; exit 1
        fi
        cat "$keep"/part-* | xz -d | tar -x -C "$target"
        echo "installed: $(awk '/^packages/{$1=""; print}' "$keep/MANIFEST") into $target"
    else
        # the first parts: every member they hold whole is unpacked; tar stops at the cut
        (cat "$keep"/part-* | xz -d 2>/dev/null | tar -x -C "$target" 2>/dev/null) || true
        echo "partly installed into $target: $have of $want parts ($(ls "$target" | tr '\n' ' '))"
    fi
}

case ${1:-} in
    pack) shift; pack "$@" ;;
    install) shift; install "$@" ;;
    *) echo "usage: infra/gpu_host.sh pack DIR [options] | install DIR [TARGET]" >&2; exit 2 ;;
esac
