#!/usr/bin/env bash
# Runs the CUDA tests of tandem-memory (VMM regions, fd export/import) and tandem-transport
# (NCCL link) on a GPU machine that has no cargo: build the test binaries elsewhere (same
# x86-64, glibc >= 2.34), copy them into one folder, and run this script from that folder.
#
#   cargo test -p tandem-memory -p tandem-transport \
#       --features tandem-memory/cuda,tandem-transport/cuda --no-run --message-format=json
#   # copy the executables of the lib targets tandem_memory, tandem_transport under those
#   # names and of the two crates' `it` targets as memory_it and transport_it into DIR,
#   # strip them, then on the GPU:
#   cd DIR && bash gpu-tests.sh            # writes $OUT/log (default /tmp/out/log)
#   NCCL_ONLY=1 REPEAT=3 NCCL_LIMIT=40 bash gpu-tests.sh   # only the NCCL tests, each 3 times
#
# libcuda comes from the driver; libnccl from PyTorch's nvidia-nccl-cu13 wheel, which ships
# only libnccl.so.2 while cudarc looks for libnccl.so: the script links one into /tmp/ncclib.
# The NCCL tests put every rank on GPU 0 as its own NCCL "host" (NCCL_HOSTID per rank, socket
# transport on lo); see transport/ARCH-NOTES.md, "On a GPU".
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
SECONDS=0
nvidia-smi -L
SITES=$(python3 -c 'import site;print(" ".join(site.getsitepackages()))' 2>/dev/null)
NCCL_SO=$(find $SITES -name 'libnccl.so*' 2>/dev/null | head -1)
[ -z "$NCCL_SO" ] && NCCL_SO=$(find /opt /usr -name 'libnccl.so*' 2>/dev/null | head -1)
echo "libnccl: $NCCL_SO"
mkdir -p /tmp/ncclib && ln -sf "$NCCL_SO" /tmp/ncclib/libnccl.so
CUDA_SO=$(ldconfig -p | grep -m1 'libcuda.so' | awk '{print $NF}')
if [ -n "$CUDA_SO" ]; then CUDA_DIR=$(dirname "$CUDA_SO"); else CUDA_DIR=/usr/local/nvidia/lib64; fi
export LD_LIBRARY_PATH=/tmp/ncclib:$(dirname "$NCCL_SO"):$CUDA_DIR:$LD_LIBRARY_PATH
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export RUST_BACKTRACE=1
t() { local lim=$1; shift; echo; echo "== [$SECONDS s] $* (limit ${lim}s)"; timeout -k 5 "$lim" "$@"; echo "== rc=$? [$SECONDS s]"; }
if [ -z "$NCCL_ONLY" ]; then
  t 30 ./tandem_memory cuda:: --test-threads=1 --nocapture
  t 90 ./memory_it cuda_vmm:: --ignored --skip child_ --test-threads=1 --nocapture
fi
for test in nccl_link_two_ranks_on_one_gpu nccl_link_three_ranks_on_one_gpu; do
  for i in $(seq "${REPEAT:-1}"); do
    t "${NCCL_LIMIT:-75}" ./transport_it --ignored --exact "nccl::$test" --test-threads=1 --nocapture
  done
done
[ -n "$NCCL_ONLY" ] && { echo "== total ${SECONDS}s"; exit 0; }
for b in tandem_memory tandem_transport; do
  [ -x "./$b" ] && t 60 "./$b" --test-threads=2
done
[ -x ./transport_it ] && t 60 ./transport_it plan:: store:: multiproc:: --test-threads=2
[ -x ./memory_it ] && t 60 ./memory_it policy:: pause_resume:: processes:: --test-threads=2
echo "== total ${SECONDS}s"
