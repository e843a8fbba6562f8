"""Where the head's API key file is and what a key may be: the plain facts about the key that
roles/serving (which writes its derived files), roles/router (which spreads the fleet's one key) and
roles/receipt (which sends it) need. On the ground floor: it imports nothing."""

# What a key may be: safe in an env file, a YAML double-quoted scalar, a curl config string and an
# HTTP header, with no quoting at all.
KEY_PATTERN = "[A-Za-z0-9._~+/=-]{16,512}"
KEY_TEXT = ("16 to 512 characters from A-Z a-z 0-9 . _ ~ + / = - (the key is written into an env file, a YAML "
            "file and an HTTP header unquoted)")


def key_file(node) -> str:
    return node.serving_api_key_file or f"{node.serving_dir}/api-key"


def generated(node) -> bool:
    """The key is sparkfleet's to create when absent (no file named in data)."""
    return node.serving_api_key_file is None
