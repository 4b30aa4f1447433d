#!/usr/bin/env bash
# The GPU checks of issues 17 and 18 in one run, sized for a lent machine's 15 minutes (about
# 9 minutes of commands at most after its start; each step has its own timeout, so one that runs
# long costs only its own figures). Run from the checkout's root on the GPU machine:
#
#     bash bench/gpu.sh [OUT_DIR]          # default: bench/results
#
# It uses the machine's own python3 (jax with CUDA), this checkout on PYTHONPATH and a fresh
# persistent compilation cache in /tmp, so every first call includes its compilation. Writes
# OUT_DIR/gpu_<UTC time>.log (everything printed) and the gdp_residue tables (natural_filter.py
# writes its own to bench/results).
# Steps, by priority:
#   1. one DP-SGD epsilon, warm (bench/profile_dpsgd.py --total), then its stages;
#   2. bench/dpsgd.py's distribution, 10^4 configurations: three untimed calls (the first
#      compiles; the others are the goal's figure: the host queues the next chunk while the
#      device works), then one under jax.profiler (the GPU's busy time and idle gaps); the same
#      at rtol=1e-2 (three untimed calls; its own shapes to compile);
#   2b. with BASELINE=<dir of another pldjax checkout> (e.g. extracted by git archive), the
#      default's untimed calls there, in a process of their own, for an A/B on one machine, in
#      the time left of LIMIT seconds (default 560);
#   3. gdp_residue, 10^4 pairs, the library's chunk size and 2,048 pairs a chunk;
#   4. V_k, 4 queries x 8 rounds on 2^14 points.
set -u
out=${1:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PLDJAX_COMPILATION_CACHE=/tmp/pldjax-gpu-cache
rm -rf "$PLDJAX_COMPILATION_CACHE"
log="$out/gpu_$(date -u +%Y%m%dT%H%M%SZ).log"
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s]"; }
left() { local l=$(( ${LIMIT:-560} - ($(date +%s) - start) )); echo $(( l > 10 ? l : 10 )); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
  git log --oneline -1 2>/dev/null; git status --short pldjax 2>/dev/null
  echo "== one configuration"; timeout 60 python3 bench/profile_dpsgd.py --total --rounds 15; elapsed
  timeout 60 python3 bench/profile_dpsgd.py --rounds 15; elapsed
  echo "== 10^4 configurations"
  timeout 200 python3 bench/profile_sweep.py --configs 10000 --calls 0 --untimed 3 --trace 12; elapsed
  echo "== 10^4 configurations, rtol=1e-2"
  timeout 150 python3 bench/profile_sweep.py --configs 10000 --calls 0 --untimed 3 --rtol 1e-2
  elapsed
  if [ -n "${BASELINE:-}" ]; then
    echo "== 10^4 configurations, baseline $BASELINE (at most $(left) s)"
    # no timed calls (the stage timers wrap this checkout's kernel signatures); the first
    # untimed call compiles
    PYTHONPATH=$BASELINE timeout "$(left)" python3 bench/profile_sweep.py --configs 10000 \
      --calls 0 --untimed 4; elapsed
    echo "== 10^4 configurations again, this checkout"
    timeout "$(left)" python3 bench/profile_sweep.py --configs 10000 --calls 0 --untimed 4; elapsed
  fi
  echo "== gdp_residue"
  timeout 50 python3 bench/gdp_residue.py --families rr,gauss --forms function --sizes 10000 \
    --no-accuracy --max-seconds 30 --deadline 45 --out-dir "$out"; elapsed
  timeout 50 python3 bench/gdp_residue.py --families rr,gauss --forms function --sizes 10000 \
    --no-accuracy --max-seconds 30 --deadline 45 --batch-size 2048 --out-dir "$out"; elapsed
  echo "== V_k"
  timeout 50 python3 bench/natural_filter.py --sizes 16384 --no-cached \
    --functions natural_filter_free --timeout 40; elapsed
} 2>&1 | tee "$log"
