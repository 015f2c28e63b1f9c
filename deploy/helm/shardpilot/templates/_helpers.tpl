{{- define "shardpilot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "shardpilot.labels" -}}
app.kubernetes.io/name: shardpilot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: shardpilot
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- with .Values.revision }}
shardpilot.io/rev: {{ . }}
{{- end }}
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
{{- include "shardpilot.secretEnv" . }}
- name: SHARDPILOT_STREAM
  value: {{ .Values.nats.stream | quote }}
- name: SHARDPILOT_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: SHARDPILOT_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: SHARDPILOT_ADMIN_TLS_ADDR
  value: {{ ternary ":15443" "" (ne .Values.adminTLS.secretName "") | quote }}
{{- if .Values.adminTLS.secretName }}
- name: SHARDPILOT_ADMIN_CERT_FILE
  value: /etc/shardpilot/admin-tls/tls.crt
- name: SHARDPILOT_ADMIN_KEY_FILE
  value: /etc/shardpilot/admin-tls/tls.key
{{- end }}
# Announced in etcd with the admin port, where shardctl finds every replica.
- name: SHARDPILOT_ADVERTISE_HOST
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
# /debug/ and the status page answer the token alone, loopback included:
# kubectl port-forward arrives from loopback (docs/security.md).
- name: SHARDPILOT_ADMIN_TOKEN_FILE
  value: /etc/shardpilot/admin/token
- name: SHARDPILOT_ADMIN_TOKEN_ON_LOOPBACK
  value: "true"
{{- end -}}

{{- define "shardpilot.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pod-level settings every part shares: security and spreading. */}}
{{- define "shardpilot.podSpec" -}}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
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

{{/* What the names proxies subscribe to may hold in one pusher: pusher.subscribedBytes.total, else a quarter of the sized memory limit (2 × the request). */}}
{{- define "shardpilot.subscribedBytesTotal" -}}
{{- $t := int .Values.pusher.subscribedBytes.total -}}
{{- if gt $t 0 }}{{ $t }}{{ else }}{{ mul (div (include "shardpilot.pusherMemoryMiB" . | int) 2) 1048576 }}{{ end -}}
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


{{/* "true" when proxies authenticate (and are served workload
certificates), "" otherwise. */}}
{{- define "shardpilot.authenticated" -}}
{{- if and .Values.pusher.ads.tls.secretName .Values.pusher.ads.tls.authenticateClients }}true{{ end }}
{{- end -}}

{{/* The Secret whose token opens the admin ports' /debug/ and status page:
adminToken.secretName, else the one the chart makes (admin-token.yaml). */}}
{{- define "shardpilot.adminTokenSecret" -}}
{{- .Values.adminToken.secretName | default (printf "%s-admin-token" .Release.Name) }}
{{- end -}}

{{/* "true" when the parts sign in to NATS as the users the chart makes, a
user per role with a password generated at install (bus-credentials.yaml):
nats.auth.type generated (the default), and in a trial, whose NATS the
chart runs, unless the type is none. */}}
{{- define "shardpilot.natsGenerated" -}}
{{- $t := .Values.nats.auth.type -}}
{{- if or (eq $t "generated") (and .Values.trial.enabled (not (has $t (list "" "none")))) }}true{{ end -}}
{{- end -}}

{{/* The Secret of the relay's signing key (signing.key) and its public key
(verify.pub): nats.signing.secretName, else the one the chart makes unless
signing is turned off (then empty). */}}
{{- define "shardpilot.busSigningSecret" -}}
{{- if .Values.nats.signing.secretName }}{{ .Values.nats.signing.secretName }}
{{- else if .Values.nats.signing.enabled }}{{ printf "%s-bus-signing" .Release.Name }}
{{- end -}}
{{- end -}}

{{/* The Secret whose seal.key seals the root kept in etcd. */}}
{{- define "shardpilot.caSealSecret" -}}
{{- .Values.pusher.ads.ca.sealSecretName | default (printf "%s-ca-seal" .Release.Name) }}
{{- end -}}

{{/* Secrets as files: the admin token, and etcd's and NATS's TLS and
credentials. Takes (dict "root" . "component" "pusher"|"ingester"); pushers
may sign in to NATS with credentials of their own (nats.auth.pusherSecretName). */}}
{{- define "shardpilot.secretVolumes" -}}
{{- $v := .root.Values -}}
{{- if and (eq .component "pusher") $v.pusher.ads.tls.secretName }}
- name: ads-tls
  secret: {secretName: {{ $v.pusher.ads.tls.secretName }}}
{{- end }}
{{- if eq .component "pusher" }}
{{- if $v.pusher.ads.ca.secretName }}
- name: ca
  secret: {secretName: {{ $v.pusher.ads.ca.secretName }}}
{{- else if include "shardpilot.authenticated" .root }}
- name: ca-seal
  secret: {secretName: {{ include "shardpilot.caSealSecret" .root }}, items: [{key: seal.key, path: seal.key}]}
{{- end }}
{{- with $v.pusher.ads.ca.trustConfigMap }}
- name: ca-trust
  configMap: {name: {{ . }}, items: [{key: roots.pem, path: roots.pem}]}
{{- end }}
{{- range $i, $c := $v.pusher.ads.remoteClusters }}
- name: cluster-{{ $i }}
  secret: {secretName: {{ $c.secretName }}, items: [{key: {{ $c.key | default $c.clusterID | quote }}, path: kubeconfig}]}
{{- end }}
{{- end }}
{{- if and (eq .component "ingester") $v.injection.enabled }}
- name: inject-tls
  secret: {secretName: {{ $v.injection.secretName | default (printf "%s-inject-tls" .root.Release.Name) }}, items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]}
{{- end }}
- name: admin-token
  secret: {secretName: {{ include "shardpilot.adminTokenSecret" .root }}, items: [{key: token, path: token}]}
{{- with $v.adminTLS.secretName }}
- name: admin-tls
  secret: {secretName: {{ . }}, items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]}
{{- end }}
{{- with include "shardpilot.busSigningSecret" .root }}
{{- $key := ternary "verify.pub" "signing.key" (eq $.component "pusher") }}
- name: bus-signing
  secret: {secretName: {{ . }}, items: [{key: {{ $key }}, path: {{ $key }}}]}
{{- end }}
{{- if include "shardpilot.natsGenerated" .root }}
- name: nats-auth
  secret: {secretName: {{ .root.Release.Name }}-nats-users, items: [{key: {{ .component }}, path: password}]}
{{- end }}
{{- if include "shardpilot.trialEtcdAuth" .root }}
- name: etcd-auth
  secret: {secretName: {{ .root.Release.Name }}-etcd-users, items: [{key: {{ .component }}, path: password}]}
{{- end }}
{{- if not $v.trial.enabled }}
{{- if $v.etcd.tls.secretName }}
- name: etcd-tls
  secret: {secretName: {{ $v.etcd.tls.secretName }}}
{{- end }}
{{- if $v.etcd.auth.roles.enabled }}
- name: etcd-auth
  secret: {secretName: {{ required "etcd.auth.roles.secretName: name the Secret holding each part's etcd password (keys ingester, pusher, shardctl)" $v.etcd.auth.roles.secretName }}, items: [{key: {{ .component }}, path: password}]}
{{- else if $v.etcd.auth.username }}
- name: etcd-auth
  secret: {secretName: {{ required "etcd.auth.secretName: name the Secret holding etcd.auth.username's password" $v.etcd.auth.secretName }}, items: [{key: password, path: password}]}
{{- end }}
{{- if $v.nats.tls.secretName }}
- name: nats-tls
  secret: {secretName: {{ $v.nats.tls.secretName }}}
{{- end }}
{{- with $v.nats.auth }}
{{- if has .type (list "creds" "nkey" "password") }}
{{- $secret := required "nats.auth.secretName: name the Secret holding the NATS credentials" .secretName }}
{{- if and (eq $.component "pusher") .pusherSecretName }}{{ $secret = .pusherSecretName }}{{ end }}
- name: nats-auth
  secret: {secretName: {{ $secret }}, items: [{key: {{ get (dict "creds" "nats.creds" "nkey" "nkey.seed" "password" "password") .type }}, path: {{ get (dict "creds" "nats.creds" "nkey" "nkey.seed" "password" "password") .type }}}]}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "shardpilot.secretMounts" -}}
{{- $v := .root.Values -}}
{{- if and (eq .component "pusher") $v.pusher.ads.tls.secretName }}
- {name: ads-tls, mountPath: /etc/shardpilot/ads-tls, readOnly: true}
{{- end }}
{{- if eq .component "pusher" }}
{{- if $v.pusher.ads.ca.secretName }}
- {name: ca, mountPath: /etc/shardpilot/ca, readOnly: true}
{{- else if include "shardpilot.authenticated" .root }}
- {name: ca-seal, mountPath: /etc/shardpilot/ca-seal, readOnly: true}
{{- end }}
{{- if $v.pusher.ads.ca.trustConfigMap }}
- {name: ca-trust, mountPath: /etc/shardpilot/ca-trust, readOnly: true}
{{- end }}
{{- range $i, $c := $v.pusher.ads.remoteClusters }}
- {name: cluster-{{ $i }}, mountPath: /etc/shardpilot/clusters/{{ $c.clusterID }}, readOnly: true}
{{- end }}
{{- end }}
{{- if and (eq .component "ingester") $v.injection.enabled }}
- {name: inject-tls, mountPath: /etc/shardpilot/inject-tls, readOnly: true}
{{- end }}
- {name: admin-token, mountPath: /etc/shardpilot/admin, readOnly: true}
{{- if include "shardpilot.busSigningSecret" .root }}
- {name: bus-signing, mountPath: /etc/shardpilot/bus-signing, readOnly: true}
{{- end }}
{{- if include "shardpilot.natsGenerated" .root }}
- {name: nats-auth, mountPath: /etc/shardpilot/nats-auth, readOnly: true}
{{- end }}
{{- if $v.adminTLS.secretName }}
- {name: admin-tls, mountPath: /etc/shardpilot/admin-tls, readOnly: true}
{{- end }}
{{- if include "shardpilot.trialEtcdAuth" .root }}
- {name: etcd-auth, mountPath: /etc/shardpilot/etcd-auth, readOnly: true}
{{- end }}
{{- if not $v.trial.enabled }}
{{- if $v.etcd.tls.secretName }}
- {name: etcd-tls, mountPath: /etc/shardpilot/etcd-tls, readOnly: true}
{{- end }}
{{- if or $v.etcd.auth.username $v.etcd.auth.roles.enabled }}
- {name: etcd-auth, mountPath: /etc/shardpilot/etcd-auth, readOnly: true}
{{- end }}
{{- if $v.nats.tls.secretName }}
- {name: nats-tls, mountPath: /etc/shardpilot/nats-tls, readOnly: true}
{{- end }}
{{- if has $v.nats.auth.type (list "creds" "nkey" "password") }}
- {name: nats-auth, mountPath: /etc/shardpilot/nats-auth, readOnly: true}
{{- end }}
{{- end }}
{{- end -}}

{{/* The relay's signing key (ingesters) or its public key (pushers). Takes
(dict "root" . "component" "pusher"|"ingester"). */}}
{{- define "shardpilot.busSigningEnv" -}}
{{- if include "shardpilot.busSigningSecret" .root }}
{{- if eq .component "pusher" }}
- name: SHARDPILOT_BUS_VERIFY_KEY_FILE
  value: /etc/shardpilot/bus-signing/verify.pub
{{- else }}
- name: SHARDPILOT_BUS_SIGNING_KEY_FILE
  value: /etc/shardpilot/bus-signing/signing.key
{{- end }}
{{- end }}
{{- end -}}

{{/* A trial's etcd with authentication: the chart makes its users
(etcd-roles.yaml). */}}
{{- define "shardpilot.trialEtcdAuth" -}}
{{- if and .Values.trial.enabled .Values.trial.etcdAuth }}true{{ end -}}
{{- end -}}

{{/* The etcd user a part signs in as: its own (etcd.auth.roles, made by
the etcd-roles hook, or in a trial by the chart) or the one shared. Takes (dict "root" . "component"
"pusher"|"ingester"). */}}
{{- define "shardpilot.etcdUserEnv" -}}
{{- $v := .root.Values -}}
{{- if include "shardpilot.trialEtcdAuth" .root }}
- name: SHARDPILOT_ETCD_USERNAME
  value: {{ printf "shardpilot-%s" .component | quote }}
- name: SHARDPILOT_ETCD_PASSWORD_FILE
  value: /etc/shardpilot/etcd-auth/password
{{- else if not $v.trial.enabled }}
{{- if and $v.etcd.auth.roles.enabled $v.etcd.auth.username }}
{{- fail "etcd.auth.roles.enabled and etcd.auth.username are alternatives: a user per part, or one shared" }}
{{- end }}
{{- if or $v.etcd.auth.username $v.etcd.auth.roles.enabled }}
- name: SHARDPILOT_ETCD_USERNAME
  value: {{ ternary (printf "shardpilot-%s" .component) $v.etcd.auth.username $v.etcd.auth.roles.enabled | quote }}
- name: SHARDPILOT_ETCD_PASSWORD_FILE
  value: /etc/shardpilot/etcd-auth/password
{{- end }}
{{- end }}
{{- end -}}

{{/* etcd's TLS files, mounted from etcd.tls.secretName. */}}
{{- define "shardpilot.etcdTLSEnv" -}}
{{- with .Values.etcd.tls }}
{{- if .secretName }}
{{- if contains "http://" $.Values.etcd.endpoints }}
{{- fail "etcd.tls.secretName is set: etcd.endpoints must be https:// URLs" }}
{{- end }}
- name: SHARDPILOT_ETCD_CA_FILE
  value: /etc/shardpilot/etcd-tls/ca.crt
{{- if .clientCertificate }}
- name: SHARDPILOT_ETCD_CERT_FILE
  value: /etc/shardpilot/etcd-tls/tls.crt
- name: SHARDPILOT_ETCD_KEY_FILE
  value: /etc/shardpilot/etcd-tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The environment that points the commands at the mounted secrets. */}}
{{- define "shardpilot.secretEnv" -}}
{{- if not .Values.trial.enabled }}
{{- include "shardpilot.etcdTLSEnv" . }}
{{- with .Values.nats.tls }}
{{- if .secretName }}
- name: SHARDPILOT_NATS_CA_FILE
  value: /etc/shardpilot/nats-tls/ca.crt
{{- if .clientCertificate }}
- name: SHARDPILOT_NATS_CERT_FILE
  value: /etc/shardpilot/nats-tls/tls.crt
- name: SHARDPILOT_NATS_KEY_FILE
  value: /etc/shardpilot/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The NATS user a part signs in as: its role's, made by the chart
(bus-credentials.yaml), or from nats.auth. Takes (dict "root" .
"component" "pusher"|"ingester"). */}}
{{- define "shardpilot.natsUserEnv" -}}
{{- if include "shardpilot.natsGenerated" .root }}
- name: SHARDPILOT_NATS_USER
  value: shardpilot-{{ .component }}
- name: SHARDPILOT_NATS_PASSWORD_FILE
  value: /etc/shardpilot/nats-auth/password
{{- else if not .root.Values.trial.enabled }}
{{- with .root.Values.nats.auth }}
{{- if eq .type "creds" }}
- name: SHARDPILOT_NATS_CREDS_FILE
  value: /etc/shardpilot/nats-auth/nats.creds
{{- else if eq .type "nkey" }}
- name: SHARDPILOT_NATS_NKEY_FILE
  value: /etc/shardpilot/nats-auth/nkey.seed
{{- else if eq .type "password" }}
- name: SHARDPILOT_NATS_USER
  value: {{ required "nats.auth.user: the NATS user whose password the Secret holds" .user | quote }}
- name: SHARDPILOT_NATS_PASSWORD_FILE
  value: /etc/shardpilot/nats-auth/password
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The port proxies dial for ADS: 15012 over TLS (where Istio's agents
dial istiod for ADS and certificates), 15010 in plaintext, served only when
no TLS Secret is given (as istiod's plaintext port). */}}
{{- define "shardpilot.adsPort" -}}
{{- ternary 15012 15010 (not (empty .Values.pusher.ads.tls.secretName)) -}}
{{- end -}}

{{/* The ADS port's name in the Services: https-xds over TLS, grpc-xds in
plaintext. */}}
{{- define "shardpilot.adsPortName" -}}
{{- ternary "https-xds" "grpc-xds" (not (empty .Values.pusher.ads.tls.secretName)) -}}
{{- end -}}

{{/* The pushers' --token-review-clusters: each remote cluster's ID and
the kubeconfig mounted from its Secret. */}}
{{- define "shardpilot.remoteClusters" -}}
{{- $out := list -}}
{{- range . -}}
{{- $out = append $out (printf "%s=/etc/shardpilot/clusters/%s/kubeconfig" .clusterID .clusterID) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

