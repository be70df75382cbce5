{{/*
The alerting rules, from values `alerts:`. Rendered into the PrometheusRule (prometheusRule.enabled) and, with
the default values, into files/alerts.yaml (python -m dev.k8s_tools alerts), the plain rule file that
`promtool check rules` reads. `alerts.selector` (PromQL label matchers, e.g. namespace="ingest") is added
to every series the rules read; empty by default.
*/}}
{{- define "kafka2delta.alertGroups" -}}
{{- $a := .Values.alerts }}
{{- $sel := "" }}
{{- if $a.selector }}{{ $sel = printf "{%s}" $a.selector }}{{ end }}
{{- $extra := $a.additionalLabels | default dict }}
- name: kafka2delta
  rules:
  {{- with $a.lagGrowing }}
  {{- if .enabled }}
    - alert: Kafka2DeltaConsumerLagGrowing
      expr: kafka2delta_consumer_lag{{ $sel }} > {{ include "kafka2delta.envValue" .minLag }} and deriv(kafka2delta_consumer_lag{{ $sel }}[{{ .window }}]) > 0
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ `kafka2delta lag on {{ $labels.topic }}[{{ $labels.partition }}] keeps growing` | quote }}
        description: {{ printf `Lag {{ $value | humanize }} messages on {{ $labels.instance }}, rising for %s: the daemon consumes slower than producers write, or is stuck.` .for | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.noCommit }}
  {{- if .enabled }}
    - alert: Kafka2DeltaNoCommit
      expr: kafka2delta_seconds_since_last_commit{{ $sel }} > {{ include "kafka2delta.envValue" (mul .minutes 60) }} and on (job, instance) (sum by (job, instance) (kafka2delta_consumer_lag{{ $sel }}) > 0)
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ printf `kafka2delta on {{ $labels.instance }} has not committed for %s minutes` (include "kafka2delta.envValue" .minutes) | quote }}
        description: {{ `No Delta commit for {{ $value | humanizeDuration }} while its partitions have lag: check the logs for storage errors, conflicts or a stuck consumer.` | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.absent }}
  {{- if .enabled }}
    - alert: Kafka2DeltaAbsent
      expr: absent(kafka2delta_build_info{{ $sel }})
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: "No kafka2delta daemon is being scraped"
        description: {{ printf "Prometheus has seen no kafka2delta_build_info series for %s: every daemon is down, or the scrape is broken." .for | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.deadLetters }}
  {{- if .enabled }}
    - alert: Kafka2DeltaDeadLetters
      expr: sum by (job, instance, topic, stage) (rate(kafka2delta_messages_dead_lettered_total{{ $sel }}[{{ .window }}])) > {{ include "kafka2delta.envValue" .ratePerSecond }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ `kafka2delta dead-letters {{ $labels.topic }} messages at stage {{ $labels.stage }}` | quote }}
        description: {{ printf `{{ $value | humanize }} dead letters per second on {{ $labels.instance }} (threshold %s/s): see the error column of the dead-letter table.` (include "kafka2delta.envValue" .ratePerSecond) | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.commitConflicts }}
  {{- if .enabled }}
    - alert: Kafka2DeltaCommitConflicts
      expr: sum by (job, instance, topic) (increase(kafka2delta_commit_conflicts_total{{ $sel }}[{{ .window }}])) > {{ include "kafka2delta.envValue" .maxConflicts }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ `Commit conflicts on {{ $labels.topic }}` | quote }}
        description: {{ printf `{{ printf "%%.0f" $value }} commit conflicts in %s on {{ $labels.instance }}: another writer moved the offsets of this table (two deployments with the same table and app id?).` .window | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.storageRetries }}
  {{- if .enabled }}
    - alert: Kafka2DeltaStorageRetries
      expr: sum by (job, instance) (rate(kafka2delta_storage_retries_total{{ $sel }}[{{ .window }}])) > {{ include "kafka2delta.envValue" .ratePerSecond }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ `kafka2delta on {{ $labels.instance }} keeps retrying storage operations` | quote }}
        description: {{ printf "Storage writes or commits have been failing and retried for %s; offsets are held until they succeed." .for | quote }}
  {{- end }}
  {{- end }}
  {{- with $a.latencyHigh }}
  {{- if .enabled }}
    - alert: Kafka2DeltaEndToEndLatencyHigh
      expr: histogram_quantile({{ include "kafka2delta.envValue" .quantile }}, sum by (job, instance, topic, le) (rate(kafka2delta_end_to_end_latency_seconds_bucket{{ $sel }}[{{ .window }}]))) > {{ include "kafka2delta.envValue" .seconds }}
      for: {{ .for }}
      labels:
        severity: {{ .severity }}
        {{- with $extra }}{{ toYaml . | nindent 8 }}{{ end }}
      annotations:
        summary: {{ `End-to-end latency of {{ $labels.topic }} is high` | quote }}
        description: {{ printf `The %s quantile of the latency from Kafka timestamp to Delta commit is {{ $value | humanizeDuration }} on {{ $labels.instance }} (threshold %s s).` (include "kafka2delta.envValue" .quantile) (include "kafka2delta.envValue" .seconds) | quote }}
  {{- end }}
  {{- end }}
{{- end }}
