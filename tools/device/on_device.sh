# Sourced on the GPU machine at the start of a call (tools/device/stage.sh
# copies it into .carry/): installs the carried wheels, puts them and
# grpc_health on PYTHONPATH, lowers the version pin of the generated stubs
# (grpcio-tools here is newer than the image's grpcio, and the stubs refuse
# an older runtime) and prints what the machine has.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=.:/tmp/site:.carry/site
GV=$(python3 -c 'import grpc; print(grpc.__version__)')
sed -i "s/^GRPC_GENERATED_VERSION = .*/GRPC_GENERATED_VERSION = '$GV'/" pagedweight/v1/*_grpc.py \
  .carry/site/grpc_health/v1/health_pb2_grpc.py
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch, triton, grpc, google.protobuf as p; print(torch.__version__, triton.__version__, grpc.__version__, p.__version__)'
# e2e_run SECONDS NAME ARGS...: benchmarks/e2e_decode.py on the synthetic Mixtral-8x7B at commit $C
# (set by the caller), its JSON and log at /tmp/runs/NAME.{json,log}, the log's last lines if it
# fails; benchmarks/merge_runs.py merges the rounds.
e2e_run() {
  mkdir -p /tmp/runs
  timeout "$1" python3 benchmarks/e2e_decode.py --preset mixtral-8x7b --commit "$C" --out "/tmp/runs/$2.json" \
    "${@:3}" > "/tmp/runs/$2.log" 2>&1 || tail -3 "/tmp/runs/$2.log"
}
# Session 50's defaults of the launches session 51 changed, as e2e_decode.py flags (A/B baselines).
S50_DEFAULTS="--pdl-max-rows 16 --pdl-moe-weight-max-rows 16 --dense-mma-max-tokens 16"
S50_DEFAULTS+=" --gate-up-interleave-max-tokens 0"
