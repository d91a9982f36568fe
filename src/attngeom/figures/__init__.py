"""attngeom.figures"""
