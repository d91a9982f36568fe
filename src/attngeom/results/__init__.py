"""attngeom.results"""
