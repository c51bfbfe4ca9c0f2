# transport/: UCX context, worker, endpoints, tagged messages.
LIB_SRCS += transport/tp.c
PKGS += ucx
