"""A repository that is a folder already on this machine, chosen by an environment variable."""

def resolve_path(ctx, path):
    """Returns ctx.path(path), reading a relative path from the workspace root."""
    if path.startswith("/"):
        return ctx.path(path)
    return ctx.path(str(ctx.path(Label("@//:WORKSPACE")).dirname) + "/" + path)

def _local_path_repository_impl(ctx):
    path = ctx.os.environ.get(ctx.attr.env_var, ctx.attr.default_path)
    root = resolve_path(ctx, path)
    if not root.exists:
        fail("%s: %s does not exist. Install it (tools/setup.sh) or set %s to its folder." %
             (ctx.name, path, ctx.attr.env_var))
    for child in root.readdir():
        ctx.symlink(child, child.basename)

local_path_repository = repository_rule(
    implementation = _local_path_repository_impl,
    attrs = {
        "default_path": attr.string(mandatory = True),
        "env_var": attr.string(mandatory = True),
    },
    environ = ["RULES_JAVA"],
    local = True,
)
