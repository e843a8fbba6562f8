"""The config model's parts, one module per role (its data keys, defaults and pure rules), and what
is rendered from them alone (the engine's command line and environment). The ground floor: imports
no role; every role imports it."""
