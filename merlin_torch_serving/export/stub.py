"""The python-backend entry point of an exported step, light to import.

tritonserver imports a python model's ``model.py`` twice while it loads it: once in a stub that
only completes the model's config (``auto_complete_config``), then in each instance's stub. The
step's own module (``python_model``) needs merlin-core, torch and the operators' libraries, seconds
of imports; here they happen in ``initialize``, which only instance stubs run, so the first stub
starts and exits in a moment and loading a step pays those imports once.
"""

from __future__ import annotations


class TritonPythonModel:
    """Triton's python-backend entry point: the step's model, imported when it is initialized."""

    def initialize(self, args):
        from merlin_torch_serving.export.python_model import TritonPythonModel as StepModel

        self._model = StepModel()
        self._model.initialize(args)

    def execute(self, requests):
        return self._model.execute(requests)
