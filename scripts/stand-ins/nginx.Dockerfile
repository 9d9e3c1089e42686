# Stand-in for the official nginx image on machines that cannot pull it: Debian bookworm's nginx with the njs
# module (the official image ships njs too; load it with `load_module modules/ngx_http_js_module.so;`), and an
# entrypoint that renders /etc/nginx/templates/*.template from the environment as the official one does.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       nginx libnginx-mod-http-js gettext-base wget ca-certificates \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/default /etc/nginx/conf.d/* \
    && ln -s /usr/lib/nginx/modules /etc/nginx/modules \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log
COPY nginx.conf /etc/nginx/nginx.conf
COPY nginx-entrypoint.sh /docker-entrypoint.sh
ENTRYPOINT ["/docker-entrypoint.sh"]
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
