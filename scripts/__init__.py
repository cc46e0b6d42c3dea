"""Developer scripts, not shipped in the wheel: the environment set-up (``setup_env.sh``),
the GPU check (``gpu_check.py``, ``make gpu-check``) and the model-index writer
(``gen_model_index.py``). Run them from the repository root; the tests import them as
``scripts.<name>``."""
