#!/bin/sh
# Entrypoint of the nginx stand-in, doing what the official image's does before it starts nginx: every
# $NGINX_ENVSUBST_TEMPLATE_DIR/**/*$NGINX_ENVSUBST_TEMPLATE_SUFFIX becomes the same relative path without the
# suffix under $NGINX_ENVSUBST_OUTPUT_DIR, with envsubst replacing only the environment variables whose names
# match the extended regular expression $NGINX_ENVSUBST_FILTER (all of them when it is empty). Other $names
# (nginx's own variables) are left alone. Like the official one, it notes its steps on stdout unless
# NGINX_ENTRYPOINT_QUIET_LOGS is set.
set -eu

note() {
    [ -n "${NGINX_ENTRYPOINT_QUIET_LOGS:-}" ] || echo "$0: $*"
}

render_templates() {
    template_dir=${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}
    suffix=${NGINX_ENVSUBST_TEMPLATE_SUFFIX:-.template}
    output_dir=${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}
    filter=${NGINX_ENVSUBST_FILTER:-}
    [ -d "$template_dir" ] || return 0
    if [ ! -w "$output_dir" ]; then
        note "$output_dir is not writable, templates are not rendered"
        return 0
    fi
    names=$(awk 'BEGIN { for (name in ENVIRON) print name }' | grep -E -e "${filter:-.}" || true)
    substituted=$(for name in $names; do printf '${%s} ' "$name"; done)
    find "$template_dir" -follow -type f -name "*$suffix" | while read -r template; do
        relative=${template#"$template_dir"/}
        output="$output_dir/${relative%"$suffix"}"
        mkdir -p "$(dirname "$output")"
        note "rendering $template to $output"
        envsubst "$substituted" < "$template" > "$output"
    done
}

if [ "${1:-}" = nginx ] || [ "${1:-}" = nginx-debug ]; then
    render_templates
    note "configuration complete; ready for start up"
fi
exec "$@"
