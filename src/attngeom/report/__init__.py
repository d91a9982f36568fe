"""attngeom.report"""
