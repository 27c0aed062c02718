# invoices/jobs.py: the handlers the tests below run.
import jobstate


@jobstate.handler("invoices.render", max_attempts=3)
def render_invoice(ctx):
    lines = ctx.parameters["lines"]
    for i in range(lines):
        ctx.progress(100 * (i + 1) // lines, f"line {i + 1} of {lines}")
    ctx.add_asset("invoice", b"INVOICE\n" * lines, name="invoice.txt")
    return {"lines": lines}


@jobstate.handler("invoices.send", max_attempts=3, retry_backoff=60)
def send_invoice(ctx):
    if ctx.attempt < 3:
        raise ConnectionError("mail server busy")  # retried 60 s, then 120 s later
    return {"sent": True}


@jobstate.handler("invoices.void")
def void_invoice(ctx):
    raise jobstate.NonRetryable(f"invoice {ctx.parameters['number']} was paid")


@jobstate.workflow("invoices.month")
class MonthlyInvoices(jobstate.Workflow):
    @jobstate.step()
    def render(self, ctx):
        for lines in ctx.parameters["customers"]:
            ctx.spawn("invoices.render", {"lines": lines})  # children, started when the step returns

    @jobstate.step()
    def total(self, ctx, render):
        return {"invoices": render["completed"]}
