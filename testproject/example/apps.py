from django.apps import AppConfig


class ExampleConfig(AppConfig):
    name = "example"
    verbose_name = "Example tasks"
    default_auto_field = "django.db.models.BigAutoField"
