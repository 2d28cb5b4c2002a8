"""Runs the code blocks of docs/drop_in_optax.md, so the page stays correct."""
import os
import re

import numpy as np
import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "drop_in_optax.md")


@pytest.mark.slow  # an executed docs page: the slow tier, with the tutorials
def test_drop_in_optax_page_runs_and_both_models_learn():
    blocks = re.findall(r"```python\n(.*?)```", open(DOC).read(), re.S)
    assert len(blocks) == 3, "expected the saving, linen and nnx blocks"
    namespace = {}
    exec(compile("\n".join(blocks), DOC, "exec"), namespace)
    assert np.isfinite(float(namespace["loss_fn"](namespace["params"])))
    assert float(namespace["loss_fn"](namespace["params"])) < float(namespace["first_loss"])
    assert float(namespace["nnx_loss_fn"](namespace["nnx_model"])) < float(namespace["nnx_first_loss"])
