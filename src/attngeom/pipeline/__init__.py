"""attngeom.pipeline"""
