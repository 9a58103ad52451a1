set terminal svg size 900,500 dynamic
set output 'latency_cdf.svg'
set title 'Latency CDFs'
set xlabel 'milliseconds'
set ylabel 'fraction of requests'
set logscale x
set key bottom right
plot 'ttft_cdf.dat' using 1:2 with lines title 'TTFT', 'e2e_cdf.dat' using 1:2 with lines title 'E2E'
set output 'throughput.svg'
set title 'Generated tokens per second (virtual time)'
unset logscale x
set xlabel 'seconds'
set ylabel 'tokens/s'
plot 'throughput.dat' using 1:2 with steps notitle
