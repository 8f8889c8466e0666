"""The YAML twin of inventory/prod.py: pyinfra reads this loader, which reads prod.yml beside
it (Ansible's YAML inventory format) and group_vars/ and host_vars/ here (docs/data-keys.md,
"YAML data"). Copy both files to start a YAML inventory of your own:

    pyinfra inventory/yaml/prod.py deploy.py
"""

from sglang_deploy.controller.yamldata import groups as _groups

globals().update(_groups(__file__))
