"""Stand-in of vLLM's NIXL transport module. Importing the real one fails
without the nixl package (STANDIN_NIXL_MISSING=1 plays that); with it, the
stand-in class only says that NIXL cannot run here."""
import os

from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport

if os.environ.get("STANDIN_NIXL_MISSING") == "1":
    raise ImportError("No module named 'nixl'")


class NixlTransport:  # a DataTransport (registered below); its methods need NIXL
    def __init__(self, name, view, config_fields=None, backends=None, num_threads=None):
        raise RuntimeError("stand-in NixlTransport: NIXL cannot run here")


DataTransport.register(NixlTransport)
