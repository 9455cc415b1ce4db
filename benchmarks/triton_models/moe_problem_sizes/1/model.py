"""Triton Python-backend model of the MoE histogram (benchmarks/triton_side_by_side.py).

counts = bincount(topk_ids.ravel(), minlength=E), E read from the output's dims in config.pbtxt; an id outside
[0, E) answers INVALID_ARG, as segfuse rejects it. The config parameter `histogram` picks NumPy on the host or
torch (on the GPU when there is one).
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.experts = int(config["output"][0]["dims"][0])
        self.histogram = config.get("parameters", {}).get("histogram", {}).get("string_value", "numpy")
        if self.histogram == "torch":
            import torch

            self.torch = torch
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        elif self.histogram != "numpy":
            raise ValueError(f"parameter histogram must be numpy or torch, not {self.histogram!r}")

    def _counts(self, ids: np.ndarray) -> np.ndarray:
        if self.histogram == "torch":
            flat = self.torch.from_numpy(ids).to(self.device).reshape(-1)
            return self.torch.bincount(flat, minlength=self.experts).cpu().numpy()
        return np.bincount(ids.reshape(-1), minlength=self.experts).astype(np.int64, copy=False)

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "topk_ids").as_numpy()
            if ids.size and (ids.min() < 0 or ids.max() >= self.experts):
                error = pb_utils.TritonError(f"topk_ids must lie in [0, {self.experts})",
                                             pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.Tensor("counts", self._counts(ids))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
