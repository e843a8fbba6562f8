"""Facts printed as `key=value` lines (one SSH round trip for several values)."""


def key_values(lines) -> dict[str, str]:
    """`key=value` lines -> dict; lines without '=' are ignored; values keep any further '='."""
    out = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out
