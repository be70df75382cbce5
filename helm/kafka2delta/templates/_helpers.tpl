{{/* Names and labels. */}}
{{- define "kafka2delta.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka2delta.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kafka2delta.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka2delta.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka2delta.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka2delta.labels" -}}
helm.sh/chart: {{ include "kafka2delta.chart" . }}
{{ include "kafka2delta.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kafka2delta
{{- end }}

{{- define "kafka2delta.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka2delta.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}: the digest wins, the tag defaults to appVersion. */}}
{{- define "kafka2delta.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* A value as the daemon's config reads it from the environment: integral numbers without an exponent
     (YAML numbers arrive as float64: 268435456 would print as 2.68435456e+08), lists comma-separated,
     mappings as JSON, everything else as text. */}}
{{- define "kafka2delta.envValue" -}}
{{- $v := . }}
{{- if kindIs "float64" $v }}
{{- if eq $v (float64 (int64 $v)) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}{{ $items = append $items (include "kafka2delta.envValue" .) }}{{ end }}
{{- join "," $items }}
{{- else if kindIs "map" $v }}
{{- toJson $v }}
{{- else }}
{{- toString $v }}
{{- end }}
{{- end }}

{{/* Keys that hold secrets never go into the ConfigMap (the daemon masks the same words in its logs). */}}
{{- define "kafka2delta.assertNotSecret" -}}
{{- if regexMatch "(?i)(password|secret|token|credential)" . }}
{{- fail (printf "config key %q holds a secret: set it under secret: (e.g. secret.extra) so that it goes into a Secret, not the ConfigMap" .) }}
{{- end }}
{{- end }}

{{/* An option of kafka.settings, table.storage_options or spark.conf: the daemon's rule for them
     (kafka2delta.config.is_secret_key): those words, oauthbearer.config, or a part named key, pem, sas or jaas
     (ssl.key.pem, AZURE_STORAGE_ACCOUNT_KEY, sasl.jaas.config, fs.azure.sas.<container>.<account>). A file's
     path is no secret (ssl.key.location, a *_file option): the file is mounted from one. */}}
{{- define "kafka2delta.assertNotSecretOption" -}}
{{- $option := index . 1 }}
{{- if regexMatch "(?i)(\\.location|_file)$" $option }}
{{- else if or (regexMatch "(?i)(password|secret|token|credential|oauthbearer\\.config)" $option) (regexMatch "(?i)(^|[._])(key|pem|sas|jaas)([._]|$)" $option) }}
{{- fail (printf "config key %q holds a secret: set it under secret: (e.g. secret.extra) so that it goes into a Secret, not the ConfigMap" (printf "%s.%s" (index . 0) $option)) }}
{{- end }}
{{- end }}

{{/* The ConfigMap's data: values `config:` (section → key → value) as K2D_<SECTION>__<KEY> variables.
     kafka.settings and table.storage_options take one more level (K2D_KAFKA__SETTINGS__SASL_MECHANISMS for
     the librdkafka key sasl.mechanisms; K2D_TABLE__STORAGE_OPTIONS__AWS_REGION as written); other mappings
     (table.schema, coercions.epoch_units) become one JSON object; `transforms:` (an ordered list) becomes
     K2D_TRANSFORMS, `routes:` (an ordered list) K2D_ROUTES. metrics.host/port come from values `metrics:`. Empty values are left out. */}}
{{- define "kafka2delta.configData" -}}
{{- $data := dict }}
{{- range $section, $values := .Values.config }}
{{- if eq $section "transforms" }}
{{- fail "config.transforms: use the top-level `transforms:` list ({target, expression}), which keeps their order" }}
{{- end }}
{{- if not (kindIs "map" $values) }}
{{- fail (printf "config.%s must be a mapping of keys to values" $section) }}
{{- end }}
{{- range $key, $value := $values }}
{{- $dotted := printf "%s.%s" $section $key }}
{{- $name := printf "K2D_%s__%s" (upper $section) (upper $key) }}
{{- if and (eq $section "metrics") (has $key (list "host" "port")) }}
{{- fail (printf "config.%s: set metrics.port in the chart's values (the probes, Service and ServiceMonitor use it)" $dotted) }}
{{- else if or (eq $dotted "kafka.settings") (eq $dotted "table.storage_options") }}
{{- range $sub, $subValue := $value }}
{{- include "kafka2delta.assertNotSecretOption" (list $dotted $sub) }}
{{- $subName := ternary (upper (replace "." "_" $sub)) $sub (eq $key "settings") }}
{{- $_ := set $data (printf "%s__%s" $name $subName) (include "kafka2delta.envValue" $subValue) }}
{{- end }}
{{- else if or (kindIs "invalid" $value) (and (or (kindIs "map" $value) (kindIs "slice" $value)) (empty $value)) }}
{{- else }}
{{- include "kafka2delta.assertNotSecret" $dotted }}
{{- if eq $dotted "spark.conf" }}
{{- range $option, $_ := $value }}{{ include "kafka2delta.assertNotSecretOption" (list $dotted $option) }}{{ end }}
{{- end }}
{{- $_ := set $data $name (include "kafka2delta.envValue" $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.transforms }}
{{- $pairs := list }}
{{- $seen := list }}
{{- range .Values.transforms }}
{{- $target := required "transforms[].target" .target }}
{{- if has $target $seen }}{{ fail (printf "transforms: target %q is given twice" $target) }}{{ end }}
{{- $seen = append $seen $target }}
{{- $pairs = append $pairs (printf "%s: %s" (toJson $target) (toJson (required "transforms[].expression" .expression))) }}
{{- end }}
{{- $_ := set $data "K2D_TRANSFORMS" (printf "{%s}" (join ", " $pairs)) }}
{{- end }}
{{- if .Values.routes }}
{{- /* Each route as JSON, its `transforms:` list made an object in the list's order (toJson sorts a map's keys). */}}
{{- $routes := list }}
{{- range $route := .Values.routes }}
{{- $json := toJson (omit $route "transforms") }}
{{- if hasKey $route "transforms" }}
{{- $pairs := list }}
{{- $seen := list }}
{{- range $route.transforms }}
{{- $target := required "routes[].transforms[].target" .target }}
{{- if has $target $seen }}{{ fail (printf "routes[].transforms: target %q is given twice" $target) }}{{ end }}
{{- $seen = append $seen $target }}
{{- $pairs = append $pairs (printf "%s: %s" (toJson $target) (toJson (required "routes[].transforms[].expression" .expression))) }}
{{- end }}
{{- $json = printf "%s%s\"transforms\": {%s}}" (trimSuffix "}" $json) (ternary "" ", " (eq $json "{}")) (join ", " $pairs) }}
{{- end }}
{{- $routes = append $routes $json }}
{{- end }}
{{- $_ := set $data "K2D_ROUTES" (printf "[%s]" (join ", " $routes)) }}
{{- end }}
{{- $_ := set $data "K2D_METRICS__HOST" "0.0.0.0" }}
{{- $_ := set $data "K2D_METRICS__PORT" (include "kafka2delta.envValue" .Values.metrics.port) }}
{{- toYaml $data }}
{{- end }}

{{/* The Secret's data (K2D_* name → value), from the named values and secret.extra. */}}
{{- define "kafka2delta.secretData" -}}
{{- $s := .Values.secret }}
{{- $data := dict }}
{{- if $s.kafkaSaslPassword }}{{ $_ := set $data "K2D_KAFKA__SETTINGS__SASL_PASSWORD" $s.kafkaSaslPassword }}{{ end }}
{{- if $s.schemaRegistryPassword }}{{ $_ := set $data "K2D_SCHEMA_REGISTRY__PASSWORD" $s.schemaRegistryPassword }}{{ end }}
{{- if $s.awsAccessKeyId }}{{ $_ := set $data "K2D_TABLE__STORAGE_OPTIONS__AWS_ACCESS_KEY_ID" $s.awsAccessKeyId }}{{ end }}
{{- if $s.awsSecretAccessKey }}{{ $_ := set $data "K2D_TABLE__STORAGE_OPTIONS__AWS_SECRET_ACCESS_KEY" $s.awsSecretAccessKey }}{{ end }}
{{- range $name, $value := $s.extra }}
{{- if not (hasPrefix "K2D_" $name) }}
{{- fail (printf "secret.extra: %q is not a K2D_* variable name" $name) }}
{{- end }}
{{- $_ := set $data $name (toString $value) }}
{{- end }}
{{- if $data }}{{ toYaml $data }}{{ end }}
{{- end }}

{{/* The Secret the pods read: an existing one, the chart's own, or none. */}}
{{- define "kafka2delta.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else if include "kafka2delta.secretData" . }}
{{- include "kafka2delta.fullname" . }}
{{- end }}
{{- end }}

{{/* envFrom shared by the daemon and the maintenance jobs: the ConfigMap, the Secret unless it is mounted as
     files (secret.mountAsFiles), extraEnvFrom. */}}
{{- define "kafka2delta.envFrom" -}}
- configMapRef:
    name: {{ include "kafka2delta.fullname" . }}
{{- if not (include "kafka2delta.secretFiles" .) }}
{{- with include "kafka2delta.secretName" . }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end }}
{{- with .Values.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Where the Secret is mounted when secret.mountAsFiles: the daemon reads every K2D_* file there as that
     variable (K2D_SECRETS_DIR; the ..data and timestamped entries of a Secret volume are ignored). */}}
{{- define "kafka2delta.secretsDir" -}}
/var/run/secrets/kafka2delta
{{- end }}

{{/* "true" when the pods read the Secret as files (secret.mountAsFiles and there is a Secret), else "". */}}
{{- define "kafka2delta.secretFiles" -}}
{{- if and .Values.secret.mountAsFiles (include "kafka2delta.secretName" .) }}true{{ end }}
{{- end }}

{{/* The EnvVar list (YAML) pointing the daemon's config loader at the mounted Secret; empty without one. */}}
{{- define "kafka2delta.secretFilesEnv" -}}
{{- if include "kafka2delta.secretFiles" . -}}
- name: K2D_SECRETS_DIR
  value: {{ include "kafka2delta.secretsDir" . }}
{{- end }}
{{- end }}

{{/* The Secret as a read-only volume (one file per key). 0440 with an fsGroup (the files' group), else 0444:
     the container's user (10001) is not their owner (root). */}}
{{- define "kafka2delta.secretFilesVolume" -}}
{{- if include "kafka2delta.secretFiles" . -}}
# The Secret's keys (K2D_* names) as files, read at start through K2D_SECRETS_DIR: never in the environment.
- name: kafka2delta-secrets
  secret:
    secretName: {{ include "kafka2delta.secretName" . }}
    {{- if (.Values.podSecurityContext | default dict).fsGroup }}
    defaultMode: 288  # 0440: root and the pod's fsGroup
    {{- else }}
    defaultMode: 292  # 0444
    {{- end }}
{{- end }}
{{- end }}

{{- define "kafka2delta.secretFilesVolumeMount" -}}
{{- if include "kafka2delta.secretFiles" . -}}
- name: kafka2delta-secrets
  mountPath: {{ include "kafka2delta.secretsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The workload the daemon runs as: a StatefulSet with static membership, else a Deployment. */}}
{{- define "kafka2delta.workloadKind" -}}
{{- ternary "StatefulSet" "Deployment" (.Values.staticMembership | default false) }}
{{- end }}

{{/* Its name: the full name; a StatefulSet's cut to 52 characters, as its pods' controller-revision-hash label
     (<name>-<10 characters>) must fit in 63. */}}
{{- define "kafka2delta.workloadName" -}}
{{- if .Values.staticMembership }}
{{- include "kafka2delta.fullname" . | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- include "kafka2delta.fullname" . }}
{{- end }}
{{- end }}

{{/* Default grace period: on SIGTERM the daemon commits what it buffered (up to the allowed latency's worth),
     and a commit storage refuses is retried for ingest.retry_after_stop_s; 60 s for the attempt under way. */}}
{{- define "kafka2delta.terminationGracePeriodSeconds" -}}
{{- if .Values.terminationGracePeriodSeconds }}
{{- .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- $latency := 5.0 }}
{{- $retry := 45.0 }}
{{- if and .Values.config.ingest (hasKey .Values.config.ingest "allowed_latency_s") }}
{{- $latency = .Values.config.ingest.allowed_latency_s }}
{{- end }}
{{- if and .Values.config.ingest (hasKey .Values.config.ingest "retry_after_stop_s") }}
{{- $retry = .Values.config.ingest.retry_after_stop_s }}
{{- end }}
{{- add (int64 (ceil (maxf $latency $retry))) 60 }}
{{- end }}
{{- end }}
