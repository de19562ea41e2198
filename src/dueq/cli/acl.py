"""``dueq acl``: the least-privilege Redis ACL rule of a role (from ``dueq.acl``)."""

from __future__ import annotations

import click

from dueq.acl import ROLES, acl_rule, combined_rule
from dueq.exceptions import ConfigurationError


@click.command()
@click.argument("roles", metavar="ROLE...", nargs=-1, required=True, type=click.Choice(ROLES))
@click.option(
    "--queue",
    "pattern",
    default="*",
    show_default=True,
    metavar="PATTERN",
    help="The queues the user may use: a name or a glob (emails, billing-*).",
)
def acl(roles: tuple[str, ...], pattern: str) -> None:
    """Print the minimal Redis ACL rule for ROLE (producer, consumer, operator).

    \b
    The last line goes after ACL SETUSER <name> reset on >password, e.g.
      redis-cli ACL SETUSER mailer reset on '>s3cret' $(dueq acl consumer --queue emails | tail -1)
    Several roles give one rule that holds them all. Redis separates queues (key patterns
    hold inside Lua scripts too) but not roles within one queue: see docs/deployment.md.
    """
    try:
        rules = [acl_rule(role, pattern) for role in dict.fromkeys(roles)]
        line = " ".join(combined_rule(tuple(r.role for r in rules), pattern))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--queue") from None
    for rule in rules:
        click.echo(f"# {rule.role} on queues {pattern!r}: {rule.description}")
    click.echo("# append to: ACL SETUSER <name> reset on >password")
    click.echo(line)
