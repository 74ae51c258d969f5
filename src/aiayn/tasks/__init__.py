"""Tasks wire data, tokenizers, a model and its loss for the shared trainer: translation, language
modeling, classification and masked-LM pretraining."""
