"""A worker's image pin (sparkfleet/model/engine.py image_pin_path, an EnvironmentFile of its unit):
its text, and the command that writes it again. roles/image writes it after each pull by digest;
roles/kernel_cache writes it back when a failed prewarm returns to the previous production."""
import shlex

from sparkfleet.model.engine import IMAGE_VAR, image_pin_path


def pin_text(ref: str) -> str:
    """The worker's pin file (an EnvironmentFile of its unit): IMAGE_VAR=<registry>/<repo>@sha256:..."""

    return f"{IMAGE_VAR}={ref}\n"


def repin_command(node, ref: str) -> str:
    """A worker's pin file written again (the image is there, pulled by `ref` before): nothing pulled."""

    q, pin = shlex.quote, image_pin_path(node)
    tmp = q(f"{pin}.tmp")
    return f"printf '%s' {q(pin_text(ref))} > {tmp} && chmod 0644 {tmp} && mv {tmp} {q(pin)}"
