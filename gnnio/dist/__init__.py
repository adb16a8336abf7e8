"""Several processes and machines on torch.distributed (NCCL on GPUs, gloo on CPU): launch,
rank context, feature rows sharded across ranks and fetched with collectives, data-parallel
training."""
