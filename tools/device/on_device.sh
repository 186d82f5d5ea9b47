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
