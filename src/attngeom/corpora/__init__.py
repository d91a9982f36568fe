"""attngeom.corpora: corpora, documents and windows: what the model reads."""
