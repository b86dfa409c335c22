"""Compiled ahead of time: libtorch steps exported with ``torch.export`` and compiled by AOTInductor
into ``.pt2`` packages, which Triton's pytorch backend (as this project builds it, see
``backends.pytorch_change``) and this process run alike.

``steps`` decides per libtorch step whether it is a package or stays TorchScript and compiles it
(``compiling``, cached by content); ``inprocess`` runs a plan with its packages; ``package`` loads
and calls one; ``exportable`` holds what the wire modules do while torch.export traces them;
``instruction_sets`` what a package is compiled for and the check of the CPU it runs on;
``tolerance`` how close to the eager modules a package must answer; ``transformers4rec`` lets
Transformers4Rec models export unchanged.
"""
