"""The shop's tasks: plain functions decorated with Django's ``@task``."""

try:
    from django.tasks import task
except ImportError:  # Django 4.2-5.x: the django-tasks backport
    from django_tasks import task


@task(priority=50)
def send_welcome(user_id: int) -> str:
    return f"welcome mail sent to user {user_id}"


@task(queue_name="reports")
async def build_report(day: str) -> dict[str, object]:
    return {"day": day, "rows": 3}


@task
def charge(cents: int) -> None:
    if cents <= 0:
        raise ValueError(f"cannot charge {cents} cents")
