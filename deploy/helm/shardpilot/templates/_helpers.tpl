{{- define "shardpilot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "shardpilot.labels" -}}
app.kubernetes.io/part-of: shardpilot
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "shardpilot.env" -}}
{{- if .Values.trial.enabled }}
- name: SHARDPILOT_ETCD_ENDPOINTS
  value: {{ printf "http://%s-etcd:2379" .Release.Name | quote }}
- name: SHARDPILOT_NATS_URL
  value: {{ printf "nats://%s-nats:4222" .Release.Name | quote }}
{{- else }}
- name: SHARDPILOT_ETCD_ENDPOINTS
  value: {{ .Values.etcd.endpoints | quote }}
- name: SHARDPILOT_NATS_URL
  value: {{ .Values.nats.url | quote }}
{{- end }}
- name: SHARDPILOT_STREAM
  value: {{ .Values.nats.stream | quote }}
- name: SHARDPILOT_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: SHARDPILOT_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
# Announced in etcd with the admin port, where shardctl finds every replica.
- name: SHARDPILOT_ADVERTISE_HOST
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
{{- if .Values.adminToken.secretName }}
- name: SHARDPILOT_ADMIN_TOKEN_FILE
  value: /etc/shardpilot/admin/token
{{- end }}
{{- end -}}

{{- define "shardpilot.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pod-level settings every part shares: security and spreading. */}}
{{- define "shardpilot.podSpec" -}}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- if .root.Values.topologySpread.enabled }}
topologySpreadConstraints:
- maxSkew: {{ .root.Values.topologySpread.maxSkew }}
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "shardpilot.selector" . | nindent 6 }}
- maxSkew: {{ .root.Values.topologySpread.maxSkew }}
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "shardpilot.selector" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The pusher's memory request in MiB, from the sizing formula in values.yaml. */}}
{{- define "shardpilot.pusherMemoryMiB" -}}
{{- $s := .Values.pusher.sizing -}}
{{- add (int $s.baseMiB) (div (mul (int $s.services) (int $s.perServiceKiB)) 1024) (div (mul (int $s.proxiesPerReplica) (int $s.perProxyKiB)) 1024) -}}
{{- end -}}

{{- define "shardpilot.pusherResources" -}}
{{- $r := deepCopy .Values.pusher.resources -}}
{{- $mib := include "shardpilot.pusherMemoryMiB" . | int -}}
{{- $req := default dict $r.requests -}}
{{- $lim := default dict $r.limits -}}
{{- if not $req.memory }}{{ $_ := set $req "memory" (printf "%dMi" $mib) }}{{ end -}}
{{- if not $lim.memory }}{{ $_ := set $lim "memory" (printf "%dMi" (mul 2 $mib)) }}{{ end -}}
{{- $_ := set $r "requests" $req -}}
{{- $_ := set $r "limits" $lim -}}
{{- toYaml $r -}}
{{- end -}}


{{/* The admin token's volume and mount, when a Secret is named. */}}
{{- define "shardpilot.adminTokenVolume" -}}
{{- if .Values.adminToken.secretName }}
- name: admin-token
  secret: {secretName: {{ .Values.adminToken.secretName }}, items: [{key: token, path: token}]}
{{- end }}
{{- end -}}
{{- define "shardpilot.adminTokenMount" -}}
{{- if .Values.adminToken.secretName }}
- {name: admin-token, mountPath: /etc/shardpilot/admin, readOnly: true}
{{- end }}
{{- end -}}
