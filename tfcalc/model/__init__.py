"""The bundled PyTorch decoder (random weights), built from the calculator's ModelSpec.

The only package besides ``tfcalc.profile`` that imports torch; import it only where torch is installed.
"""

from tfcalc.model.transformer import Transformer, build_model, scale_spec

__all__ = ["Transformer", "build_model", "scale_spec"]
