"""attngeom.core"""
