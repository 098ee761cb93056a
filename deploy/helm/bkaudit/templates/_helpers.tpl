{{/* Names and labels, in the Apache Pulsar chart's style. */}}
{{- define "bkaudit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "bkaudit.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "bkaudit.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bkaudit.image" -}}
{{- printf "%s:%s" .repository (.tag | default $.appVersion) -}}
{{- end -}}

{{- define "bkaudit.sparkServiceAccount" -}}
{{- .Values.sparkAudit.serviceAccount.name | default (printf "%s-spark" (include "bkaudit.fullname" .)) -}}
{{- end -}}

{{/* Where secrets are mounted: one directory per Secret, files only. */}}
{{- define "bkaudit.secretsDir" -}}/etc/bkaudit/secrets{{- end -}}

{{/*
conf/bkaudit.yaml for the release: the `config` values, with the connection, the secret
files and the TLS files filled in by path. Keys are flag names, as in conf/bkaudit.yaml.
*/}}
{{- define "bkaudit.config" -}}
{{- $v := .Values -}}
{{- $secrets := include "bkaudit.secretsDir" . -}}
{{- $global := dict "warehouse" (required "warehouse is required" $v.warehouse) -}}
{{- if $v.metadata.metadataUri -}}
{{- $_ := set $global "metadata-uri" $v.metadata.metadataUri -}}
{{- else -}}
{{- $_ := set $global "zk" (required "metadata.zk or metadata.metadataUri is required" $v.metadata.zk) -}}
{{- $_ := set $global "ledgers-root" $v.metadata.ledgersRoot -}}
{{- end -}}
{{- with $v.auth.zkAuth.secretName -}}
{{- $_ := set $global "zk-auth-file" (printf "%s/zk-auth/%s" $secrets $v.auth.zkAuth.key) -}}
{{- end -}}
{{- with $v.auth.ledgerPassword.secretName -}}
{{- $_ := set $global "password-file" (printf "%s/ledger-password/%s" $secrets $v.auth.ledgerPassword.key) -}}
{{- end -}}
{{- with $v.pulsarAdmin.url -}}
{{- $_ := set $global "pulsar-admin-url" . -}}
{{- end -}}
{{- with $v.auth.pulsarToken.secretName -}}
{{- $_ := set $global "pulsar-token-file" (printf "%s/pulsar-token/%s" $secrets $v.auth.pulsarToken.key) -}}
{{- end -}}
{{- if $v.tls.zookeeper.enabled -}}
{{- $_ := set $global "zk-tls" true -}}
{{- with $v.tls.zookeeper.caSecretName -}}
{{- $_ := set $global "zk-tls-ca" (printf "%s/ca.crt" $v.tls.zookeeper.caMountPath) -}}
{{- end -}}
{{- with $v.tls.zookeeper.secretName -}}
{{- $_ := set $global "zk-tls-cert" (printf "%s/tls.crt" $v.tls.zookeeper.mountPath) -}}
{{- $_ := set $global "zk-tls-key" (printf "%s/tls.key" $v.tls.zookeeper.mountPath) -}}
{{- end -}}
{{- end -}}
{{- if $v.tls.oxia.enabled -}}
{{- $_ := set $global "oxia-tls" true -}}
{{- with $v.tls.oxia.caSecretName -}}
{{- $_ := set $global "oxia-tls-ca" (printf "%s/ca.crt" $v.tls.oxia.caMountPath) -}}
{{- end -}}
{{- with $v.tls.oxia.secretName -}}
{{- $_ := set $global "oxia-tls-cert" (printf "%s/tls.crt" $v.tls.oxia.mountPath) -}}
{{- $_ := set $global "oxia-tls-key" (printf "%s/tls.key" $v.tls.oxia.mountPath) -}}
{{- end -}}
{{- with $v.tls.oxia.serverName -}}
{{- $_ := set $global "oxia-tls-server-name" . -}}
{{- end -}}
{{- end -}}
{{- with $v.auth.oxiaToken.secretName -}}
{{- if not $v.tls.oxia.enabled -}}
{{- fail "auth.oxiaToken needs tls.oxia.enabled: a token is sent to Oxia only over TLS" -}}
{{- end -}}
{{- $_ := set $global "oxia-token-file" (printf "%s/oxia-token/%s" $secrets $v.auth.oxiaToken.key) -}}
{{- end -}}
{{- if $v.tls.bookie.enabled -}}
{{- $_ := set $global "tls-provider-factory-class" "org.apache.bookkeeper.tls.TLSContextFactory" -}}
{{- $_ := set $global "tls-trust-store" (printf "%s/ca.crt" $v.tls.bookie.caMountPath) -}}
{{- with $v.tls.bookie.secretName -}}
{{- $_ := set $global "tls-certificate-path" (printf "%s/tls.crt" $v.tls.bookie.mountPath) -}}
{{- $_ := set $global "tls-key-store" (printf "%s/tls.key" $v.tls.bookie.mountPath) -}}
{{- $_ := set $global "tls-client-authentication" true -}}
{{- end -}}
{{- end -}}
{{- $watch := merge (dict "metrics-port" $v.watch.metricsPort "stop-timeout" (printf "%ds" (int $v.watch.stopTimeoutSeconds)) "spool-dir" "/var/lib/bkaudit/spool") (index $v.config "watch" | default dict) -}}
{{- $out := merge (dict "global" $global "watch" $watch) (deepCopy $v.config) -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The volumes every bkaudit pod mounts: config, secrets, TLS, scratch space. */}}
{{- define "bkaudit.volumes" -}}
- name: config
  configMap:
    name: {{ include "bkaudit.fullname" . }}
- name: tmp
  emptyDir: {}
{{- with .Values.auth.zkAuth.secretName }}
- name: zk-auth
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- with .Values.auth.ledgerPassword.secretName }}
- name: ledger-password
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- with .Values.auth.pulsarToken.secretName }}
- name: pulsar-token
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- with .Values.auth.oxiaToken.secretName }}
- name: oxia-token
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- if .Values.tls.oxia.enabled }}
{{- with .Values.tls.oxia.secretName }}
- name: oxia-tls
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- with .Values.tls.oxia.caSecretName }}
- name: oxia-tls-ca
  secret: {secretName: {{ . }}}
{{- end }}
{{- end }}
{{- if .Values.tls.zookeeper.enabled }}
{{- with .Values.tls.zookeeper.secretName }}
- name: zk-tls
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- with .Values.tls.zookeeper.caSecretName }}
- name: zk-tls-ca
  secret: {secretName: {{ . }}}
{{- end }}
{{- end }}
{{- if .Values.tls.bookie.enabled }}
{{- with .Values.tls.bookie.secretName }}
- name: bookie-tls
  secret: {secretName: {{ . }}, defaultMode: 0400}
{{- end }}
{{- if ne (include "bkaudit.sharedCa" .) "true" }}
- name: bookie-tls-ca
  secret: {secretName: {{ required "tls.bookie.caSecretName is required with bookie TLS" .Values.tls.bookie.caSecretName }}}
{{- end }}
{{- end }}
{{- with .Values.warehouseVolume }}
- name: warehouse
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "bkaudit.volumeMounts" -}}
{{- $secrets := include "bkaudit.secretsDir" . -}}
- {name: config, mountPath: /etc/bkaudit/config, readOnly: true}
- {name: tmp, mountPath: /tmp}
{{- if .Values.auth.zkAuth.secretName }}
- {name: zk-auth, mountPath: {{ $secrets }}/zk-auth, readOnly: true}
{{- end }}
{{- if .Values.auth.ledgerPassword.secretName }}
- {name: ledger-password, mountPath: {{ $secrets }}/ledger-password, readOnly: true}
{{- end }}
{{- if .Values.auth.pulsarToken.secretName }}
- {name: pulsar-token, mountPath: {{ $secrets }}/pulsar-token, readOnly: true}
{{- end }}
{{- if .Values.auth.oxiaToken.secretName }}
- {name: oxia-token, mountPath: {{ $secrets }}/oxia-token, readOnly: true}
{{- end }}
{{- if .Values.tls.oxia.enabled }}
{{- if .Values.tls.oxia.secretName }}
- {name: oxia-tls, mountPath: {{ .Values.tls.oxia.mountPath }}, readOnly: true}
{{- end }}
{{- if .Values.tls.oxia.caSecretName }}
- {name: oxia-tls-ca, mountPath: {{ .Values.tls.oxia.caMountPath }}, readOnly: true}
{{- end }}
{{- end }}
{{- if .Values.tls.zookeeper.enabled }}
{{- if .Values.tls.zookeeper.secretName }}
- {name: zk-tls, mountPath: {{ .Values.tls.zookeeper.mountPath }}, readOnly: true}
{{- end }}
{{- if .Values.tls.zookeeper.caSecretName }}
- {name: zk-tls-ca, mountPath: {{ .Values.tls.zookeeper.caMountPath }}, readOnly: true}
{{- end }}
{{- end }}
{{- if .Values.tls.bookie.enabled }}
{{- if .Values.tls.bookie.secretName }}
- {name: bookie-tls, mountPath: {{ .Values.tls.bookie.mountPath }}, readOnly: true}
{{- end }}
{{- if eq (include "bkaudit.sharedCa" .) "true" }}
{{- if ne .Values.tls.bookie.caSecretName .Values.tls.zookeeper.caSecretName }}
{{- fail "tls.bookie.caMountPath equals tls.zookeeper.caMountPath: use the same caSecretName, or another path" }}
{{- end }}
{{- else }}
- {name: bookie-tls-ca, mountPath: {{ .Values.tls.bookie.caMountPath }}, readOnly: true}
{{- end }}
{{- end }}
{{- if .Values.warehouseVolume }}
- {name: warehouse, mountPath: {{ .Values.warehouseMountPath }}}
{{- end }}
{{- end -}}

{{/* "true" when the bookie CA is the ZooKeeper CA's mount (one Secret, one path). */}}
{{- define "bkaudit.sharedCa" -}}
{{- and .Values.tls.zookeeper.enabled .Values.tls.zookeeper.caSecretName (eq .Values.tls.bookie.caMountPath .Values.tls.zookeeper.caMountPath) | toString -}}
{{- end -}}

{{/*
spark-submit --conf lines mounting the Oxia Secrets into the executor pods at the driver's
paths (Spark's spark.kubernetes.executor.secrets.<Secret>=<path>): tasks that open the store
read the same files.
*/}}
{{- define "bkaudit.sparkOxiaSecrets" -}}
{{- $secrets := include "bkaudit.secretsDir" . -}}
{{- if .Values.tls.oxia.enabled }}
{{- with .Values.tls.oxia.caSecretName }}
- --conf=spark.kubernetes.executor.secrets.{{ . }}={{ $.Values.tls.oxia.caMountPath }}
{{- end }}
{{- with .Values.tls.oxia.secretName }}
- --conf=spark.kubernetes.executor.secrets.{{ . }}={{ $.Values.tls.oxia.mountPath }}
{{- end }}
{{- end }}
{{- with .Values.auth.oxiaToken.secretName }}
- --conf=spark.kubernetes.executor.secrets.{{ . }}={{ $secrets }}/oxia-token
{{- end }}
{{- end -}}

{{- define "bkaudit.configFlag" -}}--config=/etc/bkaudit/config/bkaudit.yaml{{- end -}}
