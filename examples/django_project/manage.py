#!/usr/bin/env python
"""The example shop's manage.py: ``python manage.py dueq_worker`` runs its tasks,
``python manage.py shop_demo`` enqueues some and shows their results (docs/django.md)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
