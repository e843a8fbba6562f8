"""Your site's settings for every node: each key here replaces the shipped default of the checkout's
group_data/all.py (pyinfra reads the checkout's group_data, then this one beside your inventory; the later
wins). Only what you change belongs here; docs/data-keys.md lists every key. Upgrading sparkfleet never
touches this file.
"""

# The shipped profile (glm-5.3-flash-exl3) drafts with DFlash2, licensed CC-BY-NC-ND-4.0: non-commercial use
# only, no derivatives. sparkfleet accepts it for no one: it refuses that profile until you choose.
# Research or evaluation, accepting those terms: uncomment the line below (spelled as the profile has it).
# drafter_license_acknowledged = "CC-BY-NC-ND-4.0"
# Commercial use: serve the MTP variant, whose drafter needs no acknowledgement, instead:
# deployment_purpose = "production"
# serving_profile = "glm-5.3-flash-exl3-mtp"
