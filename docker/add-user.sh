#!/bin/sh
# Final stages: the unprivileged user the images run as (uid/gid 10001, no login shell, HOME=/tmp).
# Nothing it owns is in the image: it writes only to /tmp (an emptyDir in Kubernetes) and to the table.
#
#   docker/add-user.sh [UID]
set -eu

uid=${1:-10001}
groupadd --system --gid "$uid" kafka2delta
useradd --system --uid "$uid" --gid "$uid" --home-dir /tmp --no-create-home --shell /usr/sbin/nologin kafka2delta
