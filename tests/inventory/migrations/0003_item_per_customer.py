from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0002_priceditem"),
    ]

    operations = [
        migrations.AddField(
            model_name="item",
            name="per_customer",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
