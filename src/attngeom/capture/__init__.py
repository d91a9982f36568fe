"""attngeom.capture"""
