"""The training half of gpurec.model: data preparation (``data``), training (``training``),
tuning, cross-validation (``validation``), evaluation, the manifest, the host dispatch fit and
the cross-GPU fit.  Prediction (``gpurec.model``) never imports it; it uses prediction."""
