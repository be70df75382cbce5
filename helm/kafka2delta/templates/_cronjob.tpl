{{/* A maintenance CronJob: the `maintenance` image running `kafka2delta ARGS` with the daemon's ConfigMap and
     Secret (files under K2D_SECRETS_DIR with secret.mountAsFiles, else environment), as templates/cronjobs.yaml
     renders it for every job. Takes a dict:
       root      the chart's context
       job       the name's suffix, also the container's name and the component label (maintenance-<job>)
       schedule  the cron schedule
       spec      the job's values: suspend, env, resources, activeDeadlineSeconds (each optional)
       args      the container's arguments
     The name is <fullname>-<job>, the full name cut to 43 characters, less if the job needs it, so that the
     whole stays within 52 (a CronJob's limit: its Jobs add 11 characters). */}}
{{- define "kafka2delta.maintenanceCronJob" -}}
{{- $root := .root }}
{{- $m := $root.Values.maintenance }}
{{- $job := .job }}
{{- $spec := .spec }}
{{- $prefix := include "kafka2delta.fullname" $root | trunc (int (min 43 (sub 51 (len $job)))) | trimSuffix "-" }}
apiVersion: batch/v1
kind: CronJob
metadata:
  name: {{ printf "%s-%s" $prefix $job }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kafka2delta.labels" $root | nindent 4 }}
    app.kubernetes.io/component: maintenance-{{ $job }}
spec:
  schedule: {{ .schedule | quote }}
  {{- with $m.timeZone }}
  timeZone: {{ . | quote }}
  {{- end }}
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: {{ $m.startingDeadlineSeconds }}
  successfulJobsHistoryLimit: {{ $m.successfulJobsHistoryLimit }}
  failedJobsHistoryLimit: {{ $m.failedJobsHistoryLimit }}
  suspend: {{ $spec.suspend | default false }}
  jobTemplate:
    metadata:
      labels:
        {{- include "kafka2delta.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: maintenance-{{ $job }}
    spec:
      backoffLimit: {{ $m.backoffLimit }}
      activeDeadlineSeconds: {{ $spec.activeDeadlineSeconds | default $m.activeDeadlineSeconds }}
      template:
        metadata:
          annotations:
            checksum/config: {{ include "kafka2delta.configData" $root | sha256sum }}
            {{- with $m.podAnnotations }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          labels:
            {{- include "kafka2delta.selectorLabels" $root | nindent 12 }}
            app.kubernetes.io/component: maintenance-{{ $job }}
            {{- with $root.Values.podLabels }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
        spec:
          restartPolicy: Never
          serviceAccountName: {{ include "kafka2delta.serviceAccountName" $root }}
          automountServiceAccountToken: false
          {{- with $root.Values.imagePullSecrets }}
          imagePullSecrets:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $root.Values.podSecurityContext | nindent 12 }}
          containers:
            - name: {{ $job }}
              image: {{ include "kafka2delta.image" (list $m.image $root) | quote }}
              imagePullPolicy: {{ $m.image.pullPolicy }}
              args:
                {{- toYaml .args | nindent 16 }}
              envFrom:
                {{- include "kafka2delta.envFrom" $root | nindent 16 }}
              {{- $env := concat (include "kafka2delta.secretFilesEnv" $root | fromYamlArray) ($root.Values.extraEnv | default list) ($m.env | default list) ($spec.env | default list) }}
              {{- with $env }}
              env:
                {{- toYaml . | nindent 16 }}
              {{- end }}
              resources:
                {{- toYaml ($spec.resources | default $m.resources) | nindent 16 }}
              securityContext:
                {{- toYaml $root.Values.securityContext | nindent 16 }}
              volumeMounts:
                - name: tmp
                  mountPath: /tmp
                {{- with include "kafka2delta.secretFilesVolumeMount" $root }}
                {{- . | nindent 16 }}
                {{- end }}
                {{- with $root.Values.extraVolumeMounts }}
                {{- toYaml . | nindent 16 }}
                {{- end }}
          volumes:
            # Spark's scratch space (SPARK_LOCAL_DIRS), Ivy home and java.io.tmpdir: /tmp.
            - name: tmp
              emptyDir:
                {{- with $m.tmpVolume.medium }}
                medium: {{ . }}
                {{- end }}
                {{- with $m.tmpVolume.sizeLimit }}
                sizeLimit: {{ . }}
                {{- end }}
            {{- with include "kafka2delta.secretFilesVolume" $root }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $root.Values.extraVolumes }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with ($m.nodeSelector | default $root.Values.nodeSelector) }}
          nodeSelector:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with ($m.affinity | default $root.Values.affinity) }}
          affinity:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with ($m.tolerations | default $root.Values.tolerations) }}
          tolerations:
            {{- toYaml . | nindent 12 }}
          {{- end }}
{{- end }}
