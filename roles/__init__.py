"""Roles: one package each; a role is a few steps, each a pure command builder
plus the parser of what it reads back."""
