# tinynn from Ruby through FFI (Debian's ruby-ffi), as the original framework's users called
# its engine: `ruby generate.rb LIBTINYNN MODEL PROMPT N_TOKENS`. Prints the greedy text.
require 'ffi'

module Tinynn
  extend FFI::Library
  ffi_lib ARGV[0]

  class SessionParams < FFI::Struct
    layout :n_ctx, :uint32, :n_seq, :uint32, :n_batch, :uint32, :n_threads, :uint32,
           :strict, :bool
  end

  class SampleParams < FFI::Struct
    layout :temperature, :float, :top_k, :uint32, :top_p, :float, :min_p, :float,
           :seed, :uint64, :repeat_penalty, :float, :presence_penalty, :float,
           :frequency_penalty, :float, :penalty_last_n, :uint32
  end

  class GenerateParams < FFI::Struct
    layout :max_tokens, :uint32, :sample, SampleParams, :ignore_eos, :bool,
           :stop, :pointer, :n_stop, :size_t
  end

  callback :piece, [:pointer, :size_t, :int32, :pointer], :int32
  attach_function :tnn_last_error, [], :string
  attach_function :tnn_model_open, [:string, :pointer], :int
  attach_function :tnn_model_free, [:pointer], :int
  attach_function :tnn_session_default_params, [], SessionParams.by_value
  attach_function :tnn_session_new, [:pointer, :pointer, :pointer], :int
  attach_function :tnn_session_free, [:pointer], :int
  attach_function :tnn_generate_default_params, [], GenerateParams.by_value
  attach_function :tnn_generate, [:pointer, :string, :pointer, :piece, :pointer, :pointer], :int
  attach_function :tnn_session_clear, [:pointer, :int32], :int

  def self.check(status, what)
    raise "#{what} failed (#{status}): #{tnn_last_error}" unless status.zero?
  end
end

_, model_path, prompt, n = ARGV
out = FFI::MemoryPointer.new(:pointer)
Tinynn.check(Tinynn.tnn_model_open(model_path, out), 'tnn_model_open')
model = out.read_pointer
params = Tinynn.tnn_session_default_params
params[:n_ctx] = 1024
params[:n_threads] = 2
Tinynn.check(Tinynn.tnn_session_new(model, params.pointer, out), 'tnn_session_new')
session = out.read_pointer
gen = Tinynn.tnn_generate_default_params
gen[:max_tokens] = Integer(n)
gen[:ignore_eos] = true
text = +''
on_piece = proc { |ptr, len, _token, _user| text << ptr.read_bytes(len); 0 }
Tinynn.check(Tinynn.tnn_generate(session, prompt, gen.pointer, on_piece, nil, nil), 'tnn_generate')
# A handle of the wrong kind is an error, not a crash.
status = Tinynn.tnn_session_clear(model, 0)
raise "a model passed as a session gave #{status}" if status != 2
Tinynn.check(Tinynn.tnn_session_free(session), 'tnn_session_free')
Tinynn.check(Tinynn.tnn_model_free(model), 'tnn_model_free')
puts text.force_encoding('UTF-8')
