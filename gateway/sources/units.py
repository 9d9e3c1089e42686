"""webKnossos length units (``scale.unit`` of datasource-properties.json) in meters, for viewers and meshes."""

_UNIT_PREFIXES = {
    "yocto": 1e-24,
    "zepto": 1e-21,
    "atto": 1e-18,
    "femto": 1e-15,
    "pico": 1e-12,
    "nano": 1e-9,
    "micro": 1e-6,
    "milli": 1e-3,
    "centi": 1e-2,
    "deci": 1e-1,
    "": 1.0,
    "hecto": 1e2,
    "kilo": 1e3,
    "mega": 1e6,
    "giga": 1e9,
    "tera": 1e12,
    "peta": 1e15,
    "exa": 1e18,
    "zetta": 1e21,
    "yotta": 1e24,
}
_SHORT_PREFIXES = {"y": "yocto", "z": "zepto", "a": "atto", "f": "femto", "p": "pico", "n": "nano", "u": "micro"}
_SHORT_PREFIXES |= {"µ": "micro", "m": "milli", "c": "centi", "d": "deci", "": "", "k": "kilo", "M": "mega"}
_METERS_PER_UNIT = {f"{prefix}meter": factor for prefix, factor in _UNIT_PREFIXES.items()}
_METERS_PER_UNIT |= {f"{short}m": _UNIT_PREFIXES[long] for short, long in _SHORT_PREFIXES.items()}
_METERS_PER_UNIT |= {
    "angstrom": 1e-10,
    "inch": 0.0254,
    "foot": 0.3048,
    "yard": 0.9144,
    "mile": 1609.344,
    "parsec": 3.0856775814913673e16,
}


def meters_per_unit(unit: str) -> float:
    """Length of one ``unit`` (a webKnossos length unit, long or short form) in meters; unknown means nanometer."""
    return _METERS_PER_UNIT.get(unit.strip(), _METERS_PER_UNIT.get(unit.strip().lower(), 1e-9))
