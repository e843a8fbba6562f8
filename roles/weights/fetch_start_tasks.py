"""roles/weights, step 4b: the head's fetch started in the background before the image step, when it
needs no image: a URL or a directory source, or an image the head already holds; then each worker's pull
of what it fetches, following it file by file (roles/weights/background.py)."""
from roles.weights.background import define_start

define_start(before_build=True)
