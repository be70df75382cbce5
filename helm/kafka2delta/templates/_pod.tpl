{{/* The daemon's pod template (metadata and spec), shared by the StatefulSet (staticMembership: true) and the
     Deployment (staticMembership: false). With static membership the container gets
     K2D_KAFKA__SETTINGS__GROUP_INSTANCE_ID (librdkafka's group.instance.id) from the pod's name; with
     secret.mountAsFiles the Secret is a read-only volume read through K2D_SECRETS_DIR instead of envFrom. */}}
{{- define "kafka2delta.podTemplate" -}}
metadata:
  annotations:
    checksum/config: {{ include "kafka2delta.configData" . | sha256sum }}
    checksum/secret: {{ include "kafka2delta.secretData" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "kafka2delta.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: ingest
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "kafka2delta.serviceAccountName" . }}
  automountServiceAccountToken: false
  # Longer than a flush: on SIGTERM the daemon commits what it buffered (at most the allowed latency's
  # worth) and exits 0; default ceil(config.ingest.allowed_latency_s) + 60 s.
  terminationGracePeriodSeconds: {{ include "kafka2delta.terminationGracePeriodSeconds" . }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: kafka2delta
      image: {{ include "kafka2delta.image" (list .Values.image .) | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["ingest"]
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      envFrom:
        {{- include "kafka2delta.envFrom" . | nindent 8 }}
      {{- $env := list }}
      {{- if .Values.staticMembership }}
      {{- /* Static group membership: the pod's name, stable across restarts and rollouts in a StatefulSet. */}}
      {{- $env = append $env (dict "name" "K2D_KAFKA__SETTINGS__GROUP_INSTANCE_ID" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) }}
      {{- end }}
      {{- $env = concat $env (include "kafka2delta.secretFilesEnv" . | fromYamlArray) (.Values.extraEnv | default list) }}
      {{- with $env }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.probes.startup }}
      {{- if .enabled }}
      startupProbe:
        httpGet:
          path: {{ .path }}
          port: metrics
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      {{- end }}
      {{- with .Values.probes.liveness }}
      livenessProbe:
        httpGet:
          path: {{ .path }}
          port: metrics
        initialDelaySeconds: {{ .initialDelaySeconds }}
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      {{- with .Values.probes.readiness }}
      readinessProbe:
        httpGet:
          path: {{ .path }}
          port: metrics
        initialDelaySeconds: {{ .initialDelaySeconds }}
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- with include "kafka2delta.secretFilesVolumeMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    # The only writable path of a read-only root filesystem: HOME and TMPDIR of the image.
    - name: tmp
      emptyDir:
        {{- with .Values.tmpVolume.medium }}
        medium: {{ . }}
        {{- end }}
        {{- with .Values.tmpVolume.sizeLimit }}
        sizeLimit: {{ . }}
        {{- end }}
    {{- with include "kafka2delta.secretFilesVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
