"""What the placement tests compare of gradflow's JSON: everything but the wall times."""


def without_timing(value):
    """The JSON value with every key that names seconds or timing removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if "second" not in k and "timing" not in k}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value
