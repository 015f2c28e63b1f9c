{{- define "shardpilot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "shardpilot.labels" -}}
app.kubernetes.io/part-of: shardpilot
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "shardpilot.env" -}}
- name: SHARDPILOT_ETCD_ENDPOINTS
  value: {{ .Values.etcd.endpoints | quote }}
- name: SHARDPILOT_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: SHARDPILOT_STREAM
  value: {{ .Values.nats.stream | quote }}
- name: SHARDPILOT_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: SHARDPILOT_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
{{- end -}}
