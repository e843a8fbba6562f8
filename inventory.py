"""The front of your site: pyinfra inventory.py deploy.py (or sparkfleet plan|deploy inventory.py).

sparkfleet's file, replaced by an upgrade: never edit it. Your machines and settings live in your site
directory (docs/configuration.md): $SPARKFLEET_SITE if set, else site/ in this checkout (cp -r site.example
site). Its inventory.py declares the nodes; its group_data/*.py set what differs from the shipped
group_data/all.py; its profiles/NAME.yaml replace or add serving profiles. This file hands the site's hosts
and groups to pyinfra with the data `pyinfra SITE/inventory.py` would give them (sparkfleet/inventory.py
site_front), so either form deploys the same thing.
"""
from sparkfleet.inventory import site_front

globals().update(site_front(__file__))
