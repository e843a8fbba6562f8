"""roles/weights, step 5, after the build: the head's fetch from the hub started in the background as soon
as the image its client runs in is built, while the image ships, and each worker's pull following it
(roles/weights/background.py)."""
from roles.weights.background import define_start

define_start(before_build=False)
