# Stand-in for python:3.11-slim-bookworm on machines that cannot pull it: Debian bookworm's own Python 3.11
# with venv and a `python` command, on the minbase rootfs that scripts/docker-stand-ins imports.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv python-is-python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# The CA bundle the host trusts (a TLS-intercepting proxy's certificate included, if there is one), so that pip
# in a build that starts from this image reaches the package index the host reaches. pip uses its own bundle
# unless told otherwise, hence /etc/pip.conf.
COPY host-ca-certificates/ /usr/local/share/ca-certificates/host/
RUN update-ca-certificates \
    && printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf
CMD ["python3"]
