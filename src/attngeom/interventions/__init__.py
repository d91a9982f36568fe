"""attngeom.interventions"""
