"""attngeom.probes: probes that build their own prompts: the head atlas, the competition probes."""
